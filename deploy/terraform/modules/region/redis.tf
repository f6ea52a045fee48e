# The regional Redis Cluster: every bucket, share and daily-quota counter of
# this region lives here (seed design 5.2). Keys carry a hash tag on the
# subject, so one script call touches one shard.

resource "aws_elasticache_subnet_group" "this" {
  name        = "${local.name}-redis"
  description = "Quotient Redis Cluster subnets in ${var.region}"
  subnet_ids  = var.subnet_ids
  tags        = local.tags
}

resource "aws_elasticache_parameter_group" "this" {
  name        = "${local.name}-redis"
  family      = var.redis_parameter_group_family
  description = "Quotient Redis Cluster parameters in ${var.region}"

  parameter {
    name  = "cluster-enabled"
    value = "yes"
  }

  # Every limiter key has a TTL; evict only keys that have one, never the
  # shares and policies without TTL, if memory ever runs out.
  parameter {
    name  = "maxmemory-policy"
    value = "volatile-ttl"
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

data "aws_secretsmanager_secret_version" "redis_auth" {
  count     = var.redis_auth_token_secret_arn == null ? 0 : 1
  secret_id = var.redis_auth_token_secret_arn
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = "${local.name}-redis"
  description          = "Quotient buckets, shares and daily counters in ${var.region}"

  engine               = "redis"
  engine_version       = var.redis_engine_version
  node_type            = var.redis_node_type
  port                 = var.redis_port
  parameter_group_name = aws_elasticache_parameter_group.this.name
  subnet_group_name    = aws_elasticache_subnet_group.this.name
  security_group_ids   = [aws_security_group.redis.id]

  # Cluster mode: num_node_groups shards, each a primary with replicas in
  # other zones; a failed primary is replaced by a replica automatically.
  num_node_groups            = var.redis_num_node_groups
  replicas_per_node_group    = var.redis_replicas_per_node_group
  automatic_failover_enabled = true
  multi_az_enabled           = true

  transit_encryption_enabled = true
  transit_encryption_mode    = var.redis_transit_encryption_mode
  at_rest_encryption_enabled = true

  # AUTH with a token from Secrets Manager, when given; the coordinators
  # get it as QUOTIENT_REDIS_PASSWORD (coordinator.tf).
  auth_token                 = var.redis_auth_token_secret_arn == null ? null : data.aws_secretsmanager_secret_version.redis_auth[0].secret_string
  auth_token_update_strategy = var.redis_auth_token_secret_arn == null ? null : "ROTATE"

  snapshot_retention_limit   = var.redis_snapshot_retention_days
  auto_minor_version_upgrade = true
  apply_immediately          = false

  tags = local.tags
}
