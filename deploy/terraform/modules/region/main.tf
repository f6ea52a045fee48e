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

    # Transport security: ElastiCache encrypts in transit (redis.tf) and
    # MSK serves TLS (modules/kafka). Both certificates chain to Amazon's
    # public roots, which the image's system roots hold, so no CA file and
    # no server name: each host's own name is verified. The listener
    # serves TLS only, from the files the start-up container writes; the
    # coordinator refuses the admin API in the clear on a non-loopback
    # address. deploy/terraform's transport check keeps these in step
    # with the resources.
    QUOTIENT_REDIS_TLS       = "true"
    QUOTIENT_KAFKA_TLS       = "true"
    QUOTIENT_LISTEN_TLS_CERT = local.listen_tls_cert_file
    QUOTIENT_LISTEN_TLS_KEY  = local.listen_tls_key_file
  }

  # Settings that depend on optional inputs. The secrets themselves
  # (QUOTIENT_REDIS_PASSWORD, QUOTIENT_KAFKA_SASL_USER and
  # QUOTIENT_KAFKA_SASL_PASSWORD) are ECS secrets (coordinator.tf).
  coordinator_env_optional = merge(
    var.kafka_sasl_scram_secret_arn == null ? {} : { QUOTIENT_KAFKA_SASL = "SCRAM-SHA-512" },
    # Key parts: each part's key space is its usage shards mod N, which
    # the previous release's split layout does not follow.
    var.key_parts == 1 ? {} : {
      QUOTIENT_PARTS              = tostring(var.key_parts)
      QUOTIENT_USAGE_SPLIT_SHARDS = "0"
    },
    var.admin_client_ca_secret_arn == null ? {} : {
      QUOTIENT_LISTEN_TLS_CLIENT_CA = local.admin_client_ca_file
      QUOTIENT_ADMIN_CLIENT_CERT    = "true"
    },
  )
  coordinator_env_all = merge(local.coordinator_env, local.coordinator_env_optional)

  # Written by the start-up container next to the token file.
  listen_tls_cert_file = "${local.admin_tokens_dir}/listen-cert.pem"
  listen_tls_key_file  = "${local.admin_tokens_dir}/listen-key.pem"
  admin_client_ca_file = "${local.admin_tokens_dir}/admin-client-ca.pem"

  # The files the start-up container writes: environment variable (the
  # secret's value), path, secret.
  startup_files = concat(
    [
      { env = "ADMIN_TOKENS", path = local.admin_tokens_file, secret = var.admin_tokens_secret_arn },
      { env = "LISTEN_TLS_CERT", path = local.listen_tls_cert_file, secret = var.coordinator_tls_cert_secret_arn },
      { env = "LISTEN_TLS_KEY", path = local.listen_tls_key_file, secret = var.coordinator_tls_key_secret_arn },
    ],
    var.admin_client_ca_secret_arn == null ? [] : [
      { env = "ADMIN_CLIENT_CA", path = local.admin_client_ca_file, secret = var.admin_client_ca_secret_arn },
    ],
  )

  # Every secret the execution role reads when a task starts.
  task_secret_arns = compact([
    var.admin_tokens_secret_arn, var.coordinator_tls_cert_secret_arn, var.coordinator_tls_key_secret_arn,
    var.admin_client_ca_secret_arn, var.redis_auth_token_secret_arn, var.kafka_sasl_scram_secret_arn,
  ])

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
