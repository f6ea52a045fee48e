# One Quotient region: a Redis Cluster (ElastiCache, cluster mode) that the
# gateways and the coordinators share, and the coordinator as an ECS Fargate
# service. The resources are split by concern: redis.tf, coordinator.tf and
# security_groups.tf.

locals {
  name = "${var.name_prefix}-${var.region}"

  tags = merge(var.tags, {
    "quotient:region" = var.region
  })

  # Settings of `quotient coordinator`, passed as environment variables
  # (cmd/quotient: every flag --x-y is QUOTIENT_X_Y). Only flags that the
  # binary defines belong here: cmd/quotient/terraform_env_test.go checks
  # every name against the real flag set.
  coordinator_env = {
    QUOTIENT_REGION  = var.region
    QUOTIENT_REGIONS = join(",", var.regions)
    QUOTIENT_REDIS   = "${aws_elasticache_replication_group.this.configuration_endpoint_address}:${var.redis_port}"
    # The configuration endpoint of a cluster-mode replication group is one
    # address that stands for the whole cluster.
    QUOTIENT_REDIS_CLUSTER = "true"
    QUOTIENT_KAFKA         = join(",", var.kafka_bootstrap_brokers)
    QUOTIENT_MIRRORED      = tostring(var.kafka_mirrored)
    QUOTIENT_POLICIES      = var.policies_path
    QUOTIENT_LISTEN        = ":${var.coordinator_port}"
    QUOTIENT_EPOCH         = "${var.epoch_seconds}s"
  }
}

data "aws_region" "current" {}
