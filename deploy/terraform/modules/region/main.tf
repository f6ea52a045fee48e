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

    # Replicas: memberlist gossip on every interface, joining the others
    # through the Cloud Map name (discovery.tf). The node name is left to
    # its default, the host name, which Fargate makes unique per running
    # task (see README.md).
    QUOTIENT_GOSSIP_BIND  = "0.0.0.0:${var.gossip_port}"
    QUOTIENT_GOSSIP_SEEDS = join(",", local.gossip_seeds)

    # Control plane: follow the policy log and serve the admin API with the
    # tokens the admin-tokens container wrote from the secret.
    QUOTIENT_POLICY_LOG        = "true"
    QUOTIENT_ADMIN_TOKENS_FILE = local.admin_tokens_file
  }

  # Known at plan time, so coordinator_environment is too.
  discovery_namespace = coalesce(var.discovery_namespace, "${local.name}.internal")
  discovery_service   = "coordinator"
  coordinator_dns     = "${local.discovery_service}.${local.discovery_namespace}"

  # The loopback address first: it is this replica itself, so Join succeeds
  # when the DNS name has no other replica yet (the first task, or one
  # whose record is not published yet) instead of failing the start; every
  # other address of the name is joined as well.
  gossip_seeds = ["127.0.0.1:${var.gossip_port}", "${local.coordinator_dns}:${var.gossip_port}"]

  # Written by the admin-tokens container into a volume only this task
  # mounts (coordinator.tf).
  admin_tokens_dir  = "/run/quotient"
  admin_tokens_file = "${local.admin_tokens_dir}/admin-tokens"
}

data "aws_region" "current" {}
