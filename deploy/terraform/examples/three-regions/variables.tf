variable "name_prefix" {
  type        = string
  description = "Prefix of every resource name, e.g. quotient-prod."
  default     = "quotient"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name_prefix))
    error_message = "name_prefix must start with a lower-case letter and contain only a-z, 0-9 and '-', at most 20 characters."
  }
}

variable "networks" {
  type = map(object({
    vpc_id                        = string
    vpc_cidr                      = string
    subnet_ids                    = list(string)
    gateway_security_group_ids    = list(string)
    monitoring_security_group_ids = optional(list(string), [])
    admin_security_group_ids      = optional(list(string), [])
  }))
  description = "The existing network of each region, keyed by region (us-east-1, eu-west-1, ap-south-1): VPC, its CIDR (admitted by the other regions' Kafka brokers), three private subnets in different zones, and the security groups of the gateways, of Prometheus and of the operators' hosts that use the admin API. The VPCs must route to each other (peering or Transit Gateway) for MirrorMaker 2."

  validation {
    condition     = toset(keys(var.networks)) == toset(["us-east-1", "eu-west-1", "ap-south-1"])
    error_message = "networks must have exactly the keys us-east-1, eu-west-1 and ap-south-1."
  }

  validation {
    condition     = alltrue([for n in values(var.networks) : length(n.subnet_ids) == 3])
    error_message = "networks: every region needs exactly three subnets (one per zone for the three brokers)."
  }
}

variable "coordinator_image" {
  type        = string
  description = "Container image of quotient, with a tag or digest. Replicate it to an ECR repository in each region, or use one that every region can pull."

  validation {
    condition     = length(var.coordinator_image) > 0
    error_message = "coordinator_image must not be empty."
  }
}

variable "admin_tokens_secret_arns" {
  type        = map(string)
  description = "Per region, the ARN of the Secrets Manager secret (in that region; e.g. one secret replicated to the three) whose value is the admin API's token file: lines of \"<name> <read|admin> <token>\". See modules/region/README.md."

  validation {
    condition     = toset(keys(var.admin_tokens_secret_arns)) == toset(["us-east-1", "eu-west-1", "ap-south-1"])
    error_message = "admin_tokens_secret_arns must have exactly the keys us-east-1, eu-west-1 and ap-south-1."
  }

  validation {
    condition     = alltrue([for r, arn in var.admin_tokens_secret_arns : can(regex("^arn:aws[a-z-]*:secretsmanager:${r}:[0-9]{12}:secret:", arn))])
    error_message = "admin_tokens_secret_arns: each value must be the ARN of a Secrets Manager secret in the region of its key (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "coordinator_tls_secret_arns" {
  type = map(object({
    cert = string
    key  = string
  }))
  description = "Per region, the Secrets Manager secrets (in that region) holding the PEM certificate chain and the PEM key the coordinators' HTTPS listener (admin API, metrics, health) serves: the documented default is TLS on every listener. See modules/region/README.md."

  validation {
    condition     = toset(keys(var.coordinator_tls_secret_arns)) == toset(["us-east-1", "eu-west-1", "ap-south-1"])
    error_message = "coordinator_tls_secret_arns must have exactly the keys us-east-1, eu-west-1 and ap-south-1."
  }

  validation {
    condition     = alltrue([for r, s in var.coordinator_tls_secret_arns : can(regex("^arn:aws[a-z-]*:secretsmanager:${r}:[0-9]{12}:secret:", s.cert)) && can(regex("^arn:aws[a-z-]*:secretsmanager:${r}:[0-9]{12}:secret:", s.key))])
    error_message = "coordinator_tls_secret_arns: cert and key must be ARNs of Secrets Manager secrets in the region of their key."
  }
}

variable "redis_auth_token_secret_arns" {
  type        = map(string)
  description = "Per region (optional), the Secrets Manager secret holding the ElastiCache AUTH token; regions left out use TLS without AUTH."
  default     = {}
}

variable "mirror_plugins" {
  type = map(object({
    s3_bucket_arn = string
    s3_file_key   = string
  }))
  description = "Per region, the S3 location (in that region) of the MirrorMaker 2 plugin ZIP for MSK Connect; see deploy/terraform/README.md."

  validation {
    condition     = toset(keys(var.mirror_plugins)) == toset(["us-east-1", "eu-west-1", "ap-south-1"])
    error_message = "mirror_plugins must have exactly the keys us-east-1, eu-west-1 and ap-south-1."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags on every resource in every region."
  default     = { "app" = "quotient" }
}
