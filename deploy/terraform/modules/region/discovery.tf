# How the coordinator replicas of this region find each other: a private
# DNS namespace (AWS Cloud Map) in the VPC, and a service in it where ECS
# registers one A record per running coordinator task (awsvpc: the task's
# own IP). Every replica joins the memberlist cluster through that name
# (QUOTIENT_GOSSIP_SEEDS); memberlist's Join resolves a host name to every
# address it has and joins each one that answers, so one live replica in
# the answer is enough.

resource "aws_service_discovery_private_dns_namespace" "this" {
  name        = local.discovery_namespace
  description = "Quotient coordinators in ${var.region}: gossip discovery"
  vpc         = var.vpc_id
  tags        = local.tags
}

resource "aws_service_discovery_service" "coordinator" {
  name        = local.discovery_service
  description = "One A record per running coordinator task in ${var.region}"

  dns_config {
    namespace_id = aws_service_discovery_private_dns_namespace.this.id

    # Every task's record in each answer (up to eight), not one at random.
    routing_policy = "MULTIVALUE"

    dns_records {
      type = "A"
      ttl  = var.discovery_dns_ttl_seconds
    }
  }

  # No health check: ECS registers each task's IP and deregisters it when
  # the task stops. A joining replica needs one record of a live replica;
  # an address that does not answer is skipped.

  tags = local.tags
}
