# Kafka for one Quotient region: an MSK cluster carrying the coordinators'
# topics (topics.tf) and, with one cluster per region, MirrorMaker 2
# connectors that copy the other regions' topics into this one (mirror.tf).

locals {
  name = "${var.name_prefix}-${var.region}"

  tags = merge(var.tags, {
    "quotient:region" = var.region
  })

  scram = length(var.sasl_scram_secret_arns) > 0
  # MirrorMaker 2 (mirror.tf) speaks TLS without SASL, to this cluster and
  # from the peers': with mirroring or peers, unauthenticated TLS stays on
  # beside SCRAM.
  unauthenticated = !local.scram || length(var.replication_sources) > 0 || length(var.peer_cidr_blocks) > 0
  client_port_max = local.scram ? 9096 : 9094
}

resource "aws_security_group" "kafka" {
  name        = "${local.name}-kafka"
  description = "Quotient MSK brokers in ${var.region}: coordinators, MirrorMaker 2 and peer regions over TLS"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.name}-kafka" })
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_clients" {
  count = length(var.client_security_group_ids)

  security_group_id            = aws_security_group.kafka.id
  description                  = "Kafka TLS (9094) and, with SCRAM, SASL/SCRAM over TLS (9096) from coordinators"
  ip_protocol                  = "tcp"
  from_port                    = 9094
  to_port                      = local.client_port_max
  referenced_security_group_id = var.client_security_group_ids[count.index]
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_peers" {
  count = length(var.peer_cidr_blocks)

  security_group_id = aws_security_group.kafka.id
  description       = "Kafka TLS (and SASL/SCRAM) from peer regions (MirrorMaker 2 or shared-cluster coordinators)"
  ip_protocol       = "tcp"
  from_port         = 9094
  to_port           = local.client_port_max
  cidr_ipv4         = var.peer_cidr_blocks[count.index]
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_brokers" {
  security_group_id            = aws_security_group.kafka.id
  description                  = "Broker to broker"
  ip_protocol                  = "-1"
  referenced_security_group_id = aws_security_group.kafka.id
}

resource "aws_cloudwatch_log_group" "kafka" {
  name              = "/quotient/${var.region}/kafka"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

# Topics are created explicitly (with the configs in topics.tf), never by a
# typo in a client, hence auto.create.topics.enable=false.
resource "aws_msk_configuration" "this" {
  name           = local.name
  kafka_versions = [var.kafka_version]
  description    = "Quotient brokers in ${var.region}"

  server_properties = <<-EOT
    auto.create.topics.enable=false
    default.replication.factor=3
    min.insync.replicas=2
    num.partitions=3
    unclean.leader.election.enable=false
  EOT

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_msk_cluster" "this" {
  cluster_name           = local.name
  kafka_version          = var.kafka_version
  number_of_broker_nodes = var.broker_count

  broker_node_group_info {
    instance_type   = var.broker_instance_type
    client_subnets  = var.subnet_ids
    security_groups = [aws_security_group.kafka.id]

    storage_info {
      ebs_storage_info {
        volume_size = var.broker_volume_size_gib
      }
    }
  }

  configuration_info {
    arn      = aws_msk_configuration.this.arn
    revision = aws_msk_configuration.this.latest_revision
  }

  # TLS between clients and brokers and inside the cluster. Clients are
  # authenticated with SASL/SCRAM when sasl_scram_secret_arns is set;
  # otherwise not, and the security group alone admits only coordinators,
  # MirrorMaker and peer regions. The region module passes the matching
  # QUOTIENT_KAFKA_TLS and QUOTIENT_KAFKA_SASL (deploy/terraform checks).
  encryption_info {
    encryption_in_transit {
      client_broker = "TLS"
      in_cluster    = true
    }
  }

  client_authentication {
    unauthenticated = local.unauthenticated

    sasl {
      scram = local.scram
    }
  }

  open_monitoring {
    prometheus {
      jmx_exporter {
        enabled_in_broker = true
      }
      node_exporter {
        enabled_in_broker = true
      }
    }
  }

  logging_info {
    broker_logs {
      cloudwatch_logs {
        enabled   = true
        log_group = aws_cloudwatch_log_group.kafka.name
      }
    }
  }

  tags = local.tags
}

resource "aws_msk_scram_secret_association" "this" {
  count           = local.scram ? 1 : 0
  cluster_arn     = aws_msk_cluster.this.arn
  secret_arn_list = var.sasl_scram_secret_arns
}
