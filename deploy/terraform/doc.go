// Package terraform checks Quotient's Terraform modules (deploy/terraform)
// offline: no terraform binary, no provider download, no cloud credentials.
//
// Every check is a function of a directory, so the same code checks the real
// tree (CheckTree) and, in tests, deliberately broken copies of it:
//
//   - CheckVariables: every variable has a type and a description, every
//     output a description, and the files parse.
//   - CheckFormat: every .tf file is in canonical HCL format (hclwrite.Format,
//     the formatter behind hclfmt and terraform fmt's alignment).
//   - CheckWiring: every call of a local module passes each input that module
//     requires (no default) and no argument the module does not declare.
//   - CheckReadme: the module's README.md names every input and output.
//   - CheckCoordinatorEnv: the QUOTIENT_* settings a module passes to the
//     coordinator are known settings, and the required ones are all there.
//     The set of known settings comes from the caller (cmd/quotient's test
//     passes the real flag set), so this package does not import the binary.
//   - CheckTransportSecurity: a resource that requires secured clients
//     (ElastiCache in-transit encryption, MSK TLS or SCRAM) makes the
//     coordinator module pass the matching setting (QUOTIENT_REDIS_TLS,
//     QUOTIENT_KAFKA_TLS, QUOTIENT_KAFKA_SASL), and a module that serves
//     the admin API passes listener TLS.
//
// What it does not do: it does not validate resource arguments against the
// AWS provider schema (that needs the provider), does not plan or apply, and
// does not run hclfmt or tflint; scripts/terraform-check.sh runs those.
//
// Invariants: checks only read files; they return problems (what is wrong,
// with file and line) rather than stopping at the first, and an error only
// when a directory cannot be read at all. All functions are safe for
// concurrent use.
package terraform
