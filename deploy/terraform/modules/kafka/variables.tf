variable "name_prefix" {
  type        = string
  description = "Prefix of every resource name, e.g. quotient-prod. Lower case letters, digits and dashes; at most 20 characters (MSK cluster names are limited to 64)."
  default     = "quotient"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name_prefix))
    error_message = "name_prefix must start with a lower-case letter and contain only a-z, 0-9 and '-', at most 20 characters."
  }
}

variable "region" {
  type        = string
  description = "Name of the region this cluster serves, as the coordinators know it (e.g. us-east-1). It is the MirrorMaker 2 alias of this cluster, so mirrored topics elsewhere are named <region>.quotient.usage."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,31}$", var.region))
    error_message = "region must be 1-32 characters of a-z, 0-9 and '-', e.g. us-east-1."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC of the MSK brokers (and of the MirrorMaker 2 workers)."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC id such as vpc-0123abcd."
  }
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets, one per availability zone, for the brokers; broker_count must be a multiple of their number."

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must hold at least two subnet ids (subnet-...) in different availability zones."
  }
}

variable "client_security_group_ids" {
  type        = list(string)
  description = "Security groups allowed to reach the brokers over TLS: this region's coordinators. Gateways never talk to Kafka."

  validation {
    condition     = length(var.client_security_group_ids) >= 1 && alltrue([for s in var.client_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "client_security_group_ids must hold at least one security group id (sg-...)."
  }
}

variable "peer_cidr_blocks" {
  type        = list(string)
  description = "CIDR blocks of the other regions' VPCs, allowed to reach the brokers over TLS: their MirrorMaker 2 workers read this cluster (or, with one shared cluster, their coordinators use it). Security groups cannot be referenced across regions, hence CIDRs."
  default     = []

  validation {
    condition     = alltrue([for c in var.peer_cidr_blocks : can(cidrhost(c, 0))])
    error_message = "peer_cidr_blocks must hold CIDR blocks such as 10.1.0.0/16."
  }
}

variable "kafka_version" {
  type        = string
  description = "Apache Kafka version of the MSK cluster."
  default     = "3.6.0"

  validation {
    condition     = can(regex("^[3-9]\\.[0-9]+\\.[0-9]+(\\.x)?$", var.kafka_version))
    error_message = "kafka_version must be an MSK Kafka version of 3.x or later, such as 3.6.0."
  }
}

variable "broker_instance_type" {
  type        = string
  description = "MSK broker instance type. Quotient's Kafka traffic is small (one usage report per region per epoch, see deploy/terraform/README.md); the default is the smallest non-burstable type."
  default     = "kafka.m7g.large"

  validation {
    condition     = startswith(var.broker_instance_type, "kafka.")
    error_message = "broker_instance_type must be an MSK instance type such as kafka.m7g.large."
  }
}

variable "broker_count" {
  type        = number
  description = "Number of brokers; a multiple of the number of subnets, and at least 3 so topics can have replication factor 3 with min.insync.replicas 2."
  default     = 3

  validation {
    condition     = var.broker_count >= 3 && floor(var.broker_count) == var.broker_count
    error_message = "broker_count must be a whole number of at least 3."
  }

  validation {
    condition     = var.broker_count % length(var.subnet_ids) == 0
    error_message = "broker_count must be a multiple of the number of subnet_ids (MSK places the same number of brokers in every zone)."
  }
}

variable "broker_volume_size_gib" {
  type        = number
  description = "EBS storage per broker in GiB."
  default     = 200

  validation {
    condition     = var.broker_volume_size_gib >= 1 && var.broker_volume_size_gib <= 16384
    error_message = "broker_volume_size_gib must be from 1 to 16384."
  }
}

variable "usage_retention_hours" {
  type        = number
  description = "Retention of the usage-report topic in hours. Reports matter for the current epoch; a restarted coordinator replays only a few epochs, so one hour is plenty."
  default     = 1

  validation {
    condition     = var.usage_retention_hours >= 1 && var.usage_retention_hours <= 168
    error_message = "usage_retention_hours must be from 1 to 168."
  }
}

variable "key_parts" {
  type        = number
  description = "The region module's key_parts (the coordinators' QUOTIENT_PARTS): the usage topic gets max(3, key_parts) partitions, one per part, so each part's consumer reads only its own."
  default     = 1

  validation {
    condition     = contains([1, 2, 4, 8, 16, 32, 64, 128, 256], var.key_parts)
    error_message = "key_parts must be a power of two from 1 to 256, the region module's key_parts."
  }
}

variable "replication_sources" {
  type        = map(string)
  description = "One cluster per region: the other regions' clusters this one mirrors from with MirrorMaker 2, as region name => TLS bootstrap brokers (comma-separated host:port). Empty (the default) runs no MirrorMaker, for one shared cluster or a single region."
  default     = {}

  validation {
    condition     = alltrue([for name, brokers in var.replication_sources : can(regex("^[a-z0-9][a-z0-9-]{0,31}$", name)) && length(trimspace(brokers)) > 0])
    error_message = "replication_sources must map region names (a-z, 0-9, '-') to non-empty bootstrap broker lists."
  }

  validation {
    condition     = !contains(keys(var.replication_sources), var.region)
    error_message = "replication_sources must not include this cluster's own region."
  }
}

variable "mirror_plugin" {
  type = object({
    s3_bucket_arn = string
    s3_file_key   = string
  })
  description = "S3 location of the MSK Connect custom plugin (a ZIP holding Apache Kafka's connect-mirror and connect-mirror-client jars of kafka_connect_version) that runs MirrorMaker 2. Required when replication_sources is not empty."
  default     = null

  validation {
    condition     = var.mirror_plugin != null || length(var.replication_sources) == 0
    error_message = "mirror_plugin is required when replication_sources is not empty."
  }
}

variable "kafka_connect_version" {
  type        = string
  description = "MSK Connect (Kafka Connect) version of the MirrorMaker 2 workers."
  default     = "2.7.1"

  validation {
    condition     = can(regex("^[2-9]\\.[0-9]+\\.([0-9]+|x)$", var.kafka_connect_version))
    error_message = "kafka_connect_version must be an MSK Connect version such as 2.7.1."
  }
}

variable "mirror_mcu_count" {
  type        = number
  description = "MSK Connect units per MirrorMaker 2 worker (1 MCU = 1 vCPU, 4 GiB)."
  default     = 1

  validation {
    condition     = contains([1, 2, 4, 8], var.mirror_mcu_count)
    error_message = "mirror_mcu_count must be 1, 2, 4 or 8."
  }
}

variable "mirror_worker_count" {
  type        = number
  description = "MirrorMaker 2 workers per replicated source region."
  default     = 1

  validation {
    condition     = var.mirror_worker_count >= 1 && var.mirror_worker_count <= 10
    error_message = "mirror_worker_count must be from 1 to 10."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Days to keep broker and MirrorMaker 2 logs in CloudWatch."
  default     = 14

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

variable "sasl_scram_secret_arns" {
  type        = list(string)
  description = "MSK SCRAM secrets (Secrets Manager, names starting with AmazonMSK_, JSON {\"username\", \"password\"}, encrypted with a customer-managed KMS key, as MSK requires) to associate with the cluster. Non-empty turns on SASL/SCRAM client authentication (brokers on port 9096, output bootstrap_brokers_sasl_scram_list) and turns off unauthenticated access unless MirrorMaker 2 or peer regions use the cluster (replication_sources or peer_cidr_blocks set: MirrorMaker 2 speaks TLS without SASL here); give the coordinators' secret to the region module's kafka_sasl_scram_secret_arn. Empty (the default): TLS only, no client authentication."
  default     = []

  validation {
    condition     = alltrue([for a in var.sasl_scram_secret_arns : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:AmazonMSK_[A-Za-z0-9/_+=.@-]+$", a))])
    error_message = "sasl_scram_secret_arns must hold Secrets Manager secret ARNs whose names start with AmazonMSK_ (MSK requires the prefix)."
  }
}
