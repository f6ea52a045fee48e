variable "name_prefix" {
  type        = string
  description = "Prefix of every resource name in this region, e.g. quotient-prod. Lower case letters, digits and dashes; at most 20 characters so derived ElastiCache and ECS names stay within their limits."
  default     = "quotient"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name_prefix))
    error_message = "name_prefix must start with a lower-case letter and contain only a-z, 0-9 and '-', at most 20 characters."
  }
}

variable "region" {
  type        = string
  description = "This region's name as the coordinators know it (QUOTIENT_REGION). Use the AWS region name, e.g. us-east-1, so reports and topics are easy to trace."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,31}$", var.region))
    error_message = "region must be 1-32 characters of a-z, 0-9 and '-', e.g. us-east-1."
  }
}

variable "regions" {
  type        = list(string)
  description = "Every region of the deployment, this one included, in the same order everywhere (QUOTIENT_REGIONS). Shares are computed over exactly this list."

  validation {
    condition     = length(var.regions) >= 1 && length(distinct(var.regions)) == length(var.regions)
    error_message = "regions must list at least one region and no region twice."
  }

  validation {
    condition     = contains(var.regions, var.region)
    error_message = "regions must include this module's region."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC that holds this region's Redis cluster, coordinators and gateways."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC id such as vpc-0123abcd."
  }
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets, in at least two availability zones, for the Redis nodes and the coordinator tasks. Multi-AZ failover needs two zones or more."

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must hold at least two subnet ids (subnet-...) in different availability zones."
  }
}

variable "gateway_security_group_ids" {
  type        = list(string)
  description = "Security groups of this region's API gateways. Only these and the coordinators may reach Redis; gateways may also reach the coordinators' HTTP port (admin API)."

  validation {
    condition     = length(var.gateway_security_group_ids) >= 1 && alltrue([for s in var.gateway_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "gateway_security_group_ids must hold at least one security group id (sg-...)."
  }
}

variable "monitoring_security_group_ids" {
  type        = list(string)
  description = "Security groups of the Prometheus scrapers allowed to reach the coordinators' HTTP port (/metrics). Empty admits none."
  default     = []

  validation {
    condition     = alltrue([for s in var.monitoring_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "monitoring_security_group_ids must hold security group ids (sg-...)."
  }
}

variable "redis_node_type" {
  type        = string
  description = "ElastiCache node type of every Redis node. The default fits the seed estimate: about 42 000 script calls/s and 0.6 GB per primary (see deploy/terraform/README.md)."
  default     = "cache.m7g.large"

  validation {
    condition     = startswith(var.redis_node_type, "cache.")
    error_message = "redis_node_type must be an ElastiCache node type such as cache.m7g.large."
  }
}

variable "redis_num_node_groups" {
  type        = number
  description = "Number of Redis Cluster shards (primaries). The seed estimate gives 8 per region for 1M decisions/s over 3 regions."
  default     = 8

  validation {
    condition     = var.redis_num_node_groups >= 1 && var.redis_num_node_groups <= 500 && floor(var.redis_num_node_groups) == var.redis_num_node_groups
    error_message = "redis_num_node_groups must be a whole number from 1 to 500."
  }
}

variable "redis_replicas_per_node_group" {
  type        = number
  description = "Replicas of every shard, in other availability zones. At least 1, since automatic failover needs a replica to promote."
  default     = 1

  validation {
    condition     = var.redis_replicas_per_node_group >= 1 && var.redis_replicas_per_node_group <= 5 && floor(var.redis_replicas_per_node_group) == var.redis_replicas_per_node_group
    error_message = "redis_replicas_per_node_group must be a whole number from 1 to 5 (automatic failover needs at least one replica)."
  }
}

variable "redis_engine_version" {
  type        = string
  description = "Redis OSS engine version of the replication group; the limiter's scripts need 7 or later."
  default     = "7.1"

  validation {
    condition     = can(regex("^[7-9]\\.[0-9]+$", var.redis_engine_version))
    error_message = "redis_engine_version must be a Redis 7 or later version such as 7.1."
  }
}

variable "redis_parameter_group_family" {
  type        = string
  description = "ElastiCache parameter group family matching redis_engine_version."
  default     = "redis7"

  validation {
    condition     = can(regex("^redis[7-9]$", var.redis_parameter_group_family))
    error_message = "redis_parameter_group_family must be redis7 or later."
  }
}

variable "redis_port" {
  type        = number
  description = "TCP port of the Redis nodes."
  default     = 6379

  validation {
    condition     = var.redis_port >= 1024 && var.redis_port <= 65535
    error_message = "redis_port must be between 1024 and 65535."
  }
}

variable "redis_transit_encryption_mode" {
  type        = string
  description = "TLS in transit to Redis: required (only TLS connections) or preferred (TLS and plain text, for migrating clients)."
  default     = "required"

  validation {
    condition     = contains(["required", "preferred"], var.redis_transit_encryption_mode)
    error_message = "redis_transit_encryption_mode must be required or preferred."
  }
}

variable "redis_snapshot_retention_days" {
  type        = number
  description = "Days of daily Redis snapshots to keep. 0 (no snapshots) is the default: buckets are short-lived and a restored bucket is no better than a fresh one (seed design 9.1)."
  default     = 0

  validation {
    condition     = var.redis_snapshot_retention_days >= 0 && var.redis_snapshot_retention_days <= 35
    error_message = "redis_snapshot_retention_days must be from 0 to 35."
  }
}

variable "coordinator_image" {
  type        = string
  description = "Container image of the quotient binary, pinned by tag or digest (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/quotient:v1.2.3). The container runs `quotient coordinator`."

  validation {
    condition     = can(regex("^[^\\s]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$", var.coordinator_image))
    error_message = "coordinator_image must name an image with an explicit tag or sha256 digest, not an implicit latest."
  }
}

variable "coordinator_desired_count" {
  type        = number
  description = "Coordinator tasks in this region. They form one memberlist cluster: one leads the epoch loop and the others take over when it leaves or dies, so 2 or more for availability."
  default     = 2

  validation {
    condition     = var.coordinator_desired_count >= 1 && var.coordinator_desired_count <= 10
    error_message = "coordinator_desired_count must be from 1 to 10."
  }
}

variable "key_parts" {
  type        = number
  description = "Parts the region's coordinator replicas split the key space into (QUOTIENT_PARTS; issue 15): each live replica runs the parts it wins by rendezvous hash, so N replicas carry N times the keys. 1 (the default): one replica leads every key. It must be the same in every region, give the kafka module's key_parts the same value (one usage partition per part), and above 1 it turns off the previous release's split usage layout (QUOTIENT_USAGE_SPLIT_SHARDS=0), so every gateway must run a release that writes the packed layout first."
  default     = 1

  validation {
    condition     = contains([1, 2, 4, 8, 16, 32, 64, 128, 256], var.key_parts)
    error_message = "key_parts must be a power of two from 1 to 256 (it must divide the 16384 usage shards)."
  }
}

variable "coordinator_cpu" {
  type        = number
  description = "Fargate CPU units of one coordinator task (1024 = 1 vCPU)."
  default     = 1024

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096], var.coordinator_cpu)
    error_message = "coordinator_cpu must be one of the Fargate sizes 256, 512, 1024, 2048, 4096."
  }
}

variable "coordinator_memory" {
  type        = number
  description = "Memory of one coordinator task in MiB; must be a valid Fargate pairing with coordinator_cpu."
  default     = 2048

  validation {
    condition     = var.coordinator_memory >= 512 && var.coordinator_memory <= 30720 && var.coordinator_memory % 512 == 0
    error_message = "coordinator_memory must be a multiple of 512 MiB from 512 to 30720."
  }
}

variable "coordinator_cpu_architecture" {
  type        = string
  description = "CPU architecture of the coordinator tasks; the image must be built for it."
  default     = "ARM64"

  validation {
    condition     = contains(["ARM64", "X86_64"], var.coordinator_cpu_architecture)
    error_message = "coordinator_cpu_architecture must be ARM64 or X86_64."
  }
}

variable "coordinator_port" {
  type        = number
  description = "Port of the coordinator's HTTP server: admin API, /metrics, /healthz and /readyz (QUOTIENT_LISTEN)."
  default     = 9090

  validation {
    condition     = var.coordinator_port >= 1024 && var.coordinator_port <= 65535
    error_message = "coordinator_port must be between 1024 and 65535."
  }
}

variable "gossip_port" {
  type        = number
  description = "Port, TCP and UDP, on which the coordinator replicas gossip with each other (memberlist; QUOTIENT_GOSSIP_BIND and QUOTIENT_GOSSIP_SEEDS). Only the coordinators' security group reaches it."
  default     = 7946

  validation {
    condition     = var.gossip_port >= 1024 && var.gossip_port <= 65535 && floor(var.gossip_port) == var.gossip_port
    error_message = "gossip_port must be a whole number between 1024 and 65535."
  }

  validation {
    condition     = var.gossip_port != var.coordinator_port
    error_message = "gossip_port must differ from coordinator_port (the HTTP server's port)."
  }
}

variable "discovery_namespace" {
  type        = string
  description = "Name of the private DNS namespace (AWS Cloud Map, a Route 53 private hosted zone on vpc_id) in which the coordinator tasks register as coordinator.<namespace>; the replicas find each other through it. null (the default) is <name_prefix>-<region>.internal. It must not be a domain the VPC already resolves."
  default     = null

  validation {
    condition     = var.discovery_namespace == null || can(regex("^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z][a-z0-9-]{0,61}[a-z0-9]$", var.discovery_namespace))
    error_message = "discovery_namespace must be a lower-case DNS domain of at least two labels, such as quotient-us-east-1.internal."
  }
}

variable "discovery_dns_ttl_seconds" {
  type        = number
  description = "TTL in seconds of the coordinators' A records in the discovery namespace: how long a resolver may keep an answer, so how late a new replica can be missed or a stopped one still be tried by a joining replica."
  default     = 10

  validation {
    condition     = var.discovery_dns_ttl_seconds >= 0 && var.discovery_dns_ttl_seconds <= 300 && floor(var.discovery_dns_ttl_seconds) == var.discovery_dns_ttl_seconds
    error_message = "discovery_dns_ttl_seconds must be a whole number of seconds from 0 to 300."
  }
}

variable "admin_tokens_secret_arn" {
  type        = string
  description = "ARN of the AWS Secrets Manager secret whose value (SecretString) is the admin API's token file: one line per token, \"<name> <read|admin> <token>\", tokens of 16 bytes or more. You create it; ECS injects it into a start-up container that writes it to QUOTIENT_ADMIN_TOKENS_FILE. Tokens are read when a task starts: after changing the secret, force a new deployment."

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.admin_tokens_secret_arn))
    error_message = "admin_tokens_secret_arn must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>), not a name and not a JSON key reference."
  }
}

variable "admin_tokens_kms_key_arn" {
  type        = string
  description = "ARN of the customer-managed KMS key that encrypts admin_tokens_secret_arn, if any: the task execution role is granted kms:Decrypt on it. null (the default) for the AWS-managed key aws/secretsmanager."
  default     = null

  validation {
    condition     = var.admin_tokens_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.admin_tokens_kms_key_arn))
    error_message = "admin_tokens_kms_key_arn must be null or a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "admin_security_group_ids" {
  type        = list(string)
  description = "Security groups of the operators' hosts (the quotient CLI) allowed to reach the coordinators' HTTP port for the admin API. Empty admits none besides the gateways and monitoring groups."
  default     = []

  validation {
    condition     = alltrue([for s in var.admin_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "admin_security_group_ids must hold security group ids (sg-...)."
  }
}

variable "epoch_seconds" {
  type        = number
  description = "Rebalance interval in seconds (QUOTIENT_EPOCH). Must be the same in every region, since epochs are aligned to wall-clock multiples of it."
  default     = 10

  validation {
    condition     = var.epoch_seconds >= 1 && var.epoch_seconds <= 3600 && floor(var.epoch_seconds) == var.epoch_seconds
    error_message = "epoch_seconds must be a whole number of seconds from 1 to 3600."
  }
}

variable "kafka_bootstrap_brokers" {
  type        = list(string)
  description = "Kafka bootstrap brokers (host:port) the coordinators use (QUOTIENT_KAFKA): this region's MSK cluster, or the one shared cluster."

  validation {
    condition     = length(var.kafka_bootstrap_brokers) >= 1 && alltrue([for b in var.kafka_bootstrap_brokers : can(regex("^[^\\s:,]+:[0-9]+$", b))])
    error_message = "kafka_bootstrap_brokers must hold at least one host:port, without commas."
  }
}

variable "kafka_mirrored" {
  type        = bool
  description = "True when every region has its own Kafka cluster mirrored with MirrorMaker 2 (the kafka module's layout): coordinators also consume <region>.quotient.usage of the other regions (QUOTIENT_MIRRORED). False for one shared cluster."
  default     = true
}

variable "policies_path" {
  type        = string
  description = "Path, inside the coordinator container, of the JSON policy file whose scope:global policies the coordinators share (QUOTIENT_POLICIES). Bake it into the image or mount it; it must be the gateways' policy file."
  default     = "/etc/quotient/policies.json"

  validation {
    condition     = startswith(var.policies_path, "/")
    error_message = "policies_path must be an absolute path inside the container."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Days to keep the coordinator logs in CloudWatch."
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a CloudWatch retention value such as 7, 14, 30, 90 or 365."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource of this module."
  default     = {}
}

variable "coordinator_tls_cert_secret_arn" {
  type        = string
  description = "ARN of the Secrets Manager secret whose value is the PEM certificate chain the coordinators' HTTP listener (admin API, /metrics, health) serves TLS with. The start-up container writes it to QUOTIENT_LISTEN_TLS_CERT; the coordinator re-reads the file when it changes, and ECS re-reads the secret when a task starts."

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.coordinator_tls_cert_secret_arn))
    error_message = "coordinator_tls_cert_secret_arn must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "coordinator_tls_key_secret_arn" {
  type        = string
  description = "ARN of the Secrets Manager secret whose value is the PEM private key of coordinator_tls_cert_secret_arn (written to QUOTIENT_LISTEN_TLS_KEY, readable by the coordinator only)."

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.coordinator_tls_key_secret_arn))
    error_message = "coordinator_tls_key_secret_arn must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "admin_client_ca_secret_arn" {
  type        = string
  description = "ARN of a Secrets Manager secret holding a PEM bundle of CAs: when set, the admin API also requires a client certificate signed by one of them (QUOTIENT_LISTEN_TLS_CLIENT_CA, QUOTIENT_ADMIN_CLIENT_CERT); /metrics and the health endpoints do not. null (the default): bearer tokens over TLS only."
  default     = null

  validation {
    condition     = var.admin_client_ca_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.admin_client_ca_secret_arn))
    error_message = "admin_client_ca_secret_arn must be null or be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "redis_auth_token_secret_arn" {
  type        = string
  description = "ARN of a Secrets Manager secret whose value is the ElastiCache AUTH token (16 to 128 printable characters): set on the replication group and passed to the coordinators as the secret variable QUOTIENT_REDIS_PASSWORD (never a flag). The token is read at plan time into the Terraform state, as any auth_token is: protect the state. null (the default): no AUTH, TLS only."
  default     = null

  validation {
    condition     = var.redis_auth_token_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.redis_auth_token_secret_arn))
    error_message = "redis_auth_token_secret_arn must be null or be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "kafka_sasl_scram_secret_arn" {
  type        = string
  description = "ARN of the MSK SCRAM secret (name AmazonMSK_..., JSON {\"username\", \"password\"}, associated with the cluster by modules/kafka sasl_scram_secret_arns): the coordinators authenticate with SASL SCRAM-SHA-512 (QUOTIENT_KAFKA_SASL, and the secret variables QUOTIENT_KAFKA_SASL_USER and QUOTIENT_KAFKA_SASL_PASSWORD); kafka_bootstrap_brokers must then be the SASL/SCRAM brokers (port 9096). null (the default): TLS only."
  default     = null

  validation {
    condition     = var.kafka_sasl_scram_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", var.kafka_sasl_scram_secret_arn))
    error_message = "kafka_sasl_scram_secret_arn must be null or be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>)."
  }
}

variable "secrets_kms_key_arns" {
  type        = list(string)
  description = "Customer-managed KMS keys that encrypt the TLS, Redis AUTH or Kafka SCRAM secrets above (MSK requires one for SCRAM secrets): the task execution role may kms:Decrypt with them. Empty (the default) when they use aws/secretsmanager."
  default     = []

  validation {
    condition     = alltrue([for k in var.secrets_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", k))])
    error_message = "secrets_kms_key_arns must hold KMS key ARNs (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}
