# tflint settings for the offline checks (scripts/terraform-check.sh).
# Only the terraform ruleset bundled with tflint: it needs no download, so
# the checks run without network or cloud credentials. The AWS ruleset is
# a plugin that must be downloaded, and is deliberately not used.
config {
  # Inspect module calls to local modules (../../modules/...) too.
  call_module_type = "local"
}

plugin "terraform" {
  enabled = true
  preset  = "all"
}
