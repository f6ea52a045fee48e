# Redis admits only the gateways and the coordinators of this region. The
# coordinators' HTTP port (admin API, /metrics, /healthz) admits the
# gateways, the monitoring groups and the admin groups; their gossip port
# admits only the other coordinators. Rules are separate resources so the
# groups can refer to each other without a cycle; count (not for_each) over
# the ids you pass keeps the plan valid when they are created in the same
# apply.

resource "aws_security_group" "redis" {
  name        = "${local.name}-redis"
  description = "Quotient Redis Cluster in ${var.region}: gateways and coordinators only"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.name}-redis" })
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_gateways" {
  count = length(var.gateway_security_group_ids)

  security_group_id            = aws_security_group.redis.id
  description                  = "Redis from gateways"
  ip_protocol                  = "tcp"
  from_port                    = var.redis_port
  to_port                      = var.redis_port
  referenced_security_group_id = var.gateway_security_group_ids[count.index]
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_coordinators" {
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis from coordinators"
  ip_protocol                  = "tcp"
  from_port                    = var.redis_port
  to_port                      = var.redis_port
  referenced_security_group_id = aws_security_group.coordinator.id
}

resource "aws_security_group" "coordinator" {
  name        = "${local.name}-coordinator"
  description = "Quotient coordinators in ${var.region}"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.name}-coordinator" })
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_gateways" {
  count = length(var.gateway_security_group_ids)

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Coordinator HTTP (admin API) from gateways"
  ip_protocol                  = "tcp"
  from_port                    = var.coordinator_port
  to_port                      = var.coordinator_port
  referenced_security_group_id = var.gateway_security_group_ids[count.index]
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_monitoring" {
  count = length(var.monitoring_security_group_ids)

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Coordinator /metrics from Prometheus"
  ip_protocol                  = "tcp"
  from_port                    = var.coordinator_port
  to_port                      = var.coordinator_port
  referenced_security_group_id = var.monitoring_security_group_ids[count.index]
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_admins" {
  count = length(var.admin_security_group_ids)

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Coordinator admin API from operators (quotient CLI)"
  ip_protocol                  = "tcp"
  from_port                    = var.coordinator_port
  to_port                      = var.coordinator_port
  referenced_security_group_id = var.admin_security_group_ids[count.index]
}

# Gossip between the replicas of this region only (memberlist: UDP for
# probes and gossip, TCP for joins and state sync, one port). Nothing else
# reaches the gossip port; replicas need no other port of each other.
resource "aws_vpc_security_group_ingress_rule" "coordinator_gossip" {
  for_each = toset(["tcp", "udp"])

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Coordinator gossip (${upper(each.key)}) from the other replicas"
  ip_protocol                  = each.key
  from_port                    = var.gossip_port
  to_port                      = var.gossip_port
  referenced_security_group_id = aws_security_group.coordinator.id
}

# Coordinators reach Redis, Kafka (possibly in a peered VPC), ECR and
# CloudWatch; the destinations admit them by security group or are AWS
# endpoints, so egress is open.
resource "aws_vpc_security_group_egress_rule" "coordinator_all" {
  security_group_id = aws_security_group.coordinator.id
  description       = "Coordinator egress: Redis, Kafka, ECR, CloudWatch"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}
