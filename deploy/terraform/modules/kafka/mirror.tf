# MirrorMaker 2 on MSK Connect, for one cluster per region: one
# MirrorSourceConnector per other region, running here, reads that region's
# topics and writes them into this cluster as <source region>.<topic>
# (DefaultReplicationPolicy). Remote topics are never mirrored again, so a
# full mesh of regions has no loops. Nothing is created when
# replication_sources is empty (one shared cluster).

locals {
  mirror = length(var.replication_sources) > 0

  # MirrorMaker matches each pattern against the whole topic name, so
  # "quotient\.usage" does not match "eu-west-1.quotient.usage".
  mirror_topics = join(",", [for topic in sort(keys(local.topics)) : replace(topic, ".", "\\.")])
}

resource "aws_security_group" "mirror" {
  count = local.mirror ? 1 : 0

  name        = "${local.name}-mirror"
  description = "Quotient MirrorMaker 2 workers in ${var.region}"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.name}-mirror" })
}

resource "aws_vpc_security_group_egress_rule" "mirror_all" {
  count = local.mirror ? 1 : 0

  security_group_id = aws_security_group.mirror[0].id
  description       = "MirrorMaker 2 to the local and remote brokers"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_mirror" {
  count = local.mirror ? 1 : 0

  security_group_id            = aws_security_group.kafka.id
  description                  = "Kafka TLS from MirrorMaker 2"
  ip_protocol                  = "tcp"
  from_port                    = 9094
  to_port                      = 9094
  referenced_security_group_id = aws_security_group.mirror[0].id
}

data "aws_iam_policy_document" "mirror_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["kafkaconnect.amazonaws.com"]
    }
  }
}

# The brokers do not authenticate clients, so the workers need no Kafka
# permissions; the role is what MSK Connect requires to run them.
resource "aws_iam_role" "mirror" {
  count = local.mirror ? 1 : 0

  name               = "${local.name}-mirror"
  assume_role_policy = data.aws_iam_policy_document.mirror_assume.json
  tags               = local.tags
}

resource "aws_mskconnect_custom_plugin" "mirror" {
  count = local.mirror ? 1 : 0

  name         = "${local.name}-mirrormaker2"
  content_type = "ZIP"
  description  = "Apache Kafka MirrorMaker 2 connectors"

  location {
    s3 {
      bucket_arn = var.mirror_plugin.s3_bucket_arn
      file_key   = var.mirror_plugin.s3_file_key
    }
  }
}

resource "aws_cloudwatch_log_group" "mirror" {
  count = local.mirror ? 1 : 0

  name              = "/quotient/${var.region}/mirrormaker2"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_mskconnect_connector" "mirror" {
  for_each = var.replication_sources

  name                 = "${local.name}-from-${each.key}"
  kafkaconnect_version = var.kafka_connect_version

  capacity {
    provisioned_capacity {
      mcu_count    = var.mirror_mcu_count
      worker_count = var.mirror_worker_count
    }
  }

  connector_configuration = {
    "connector.class"                  = "org.apache.kafka.connect.mirror.MirrorSourceConnector"
    "tasks.max"                        = "3"
    "source.cluster.alias"             = each.key
    "target.cluster.alias"             = var.region
    "source.cluster.bootstrap.servers" = each.value
    "target.cluster.bootstrap.servers" = aws_msk_cluster.this.bootstrap_brokers_tls
    "source.cluster.security.protocol" = "SSL"
    "target.cluster.security.protocol" = "SSL"
    "topics"                           = local.mirror_topics
    "replication.policy.class"         = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
    "replication.policy.separator"     = "."
    "replication.factor"               = "3"
    "sync.topic.configs.enabled"       = "true"
    "sync.topic.acls.enabled"          = "false"
    "refresh.topics.interval.seconds"  = "60"
    "key.converter"                    = "org.apache.kafka.connect.converters.ByteArrayConverter"
    "value.converter"                  = "org.apache.kafka.connect.converters.ByteArrayConverter"
    "header.converter"                 = "org.apache.kafka.connect.converters.ByteArrayConverter"
  }

  kafka_cluster {
    apache_kafka_cluster {
      bootstrap_servers = aws_msk_cluster.this.bootstrap_brokers_tls

      vpc {
        security_groups = [aws_security_group.mirror[0].id]
        subnets         = var.subnet_ids
      }
    }
  }

  kafka_cluster_client_authentication {
    authentication_type = "NONE"
  }

  kafka_cluster_encryption_in_transit {
    encryption_type = "TLS"
  }

  plugin {
    custom_plugin {
      arn      = aws_mskconnect_custom_plugin.mirror[0].arn
      revision = aws_mskconnect_custom_plugin.mirror[0].latest_revision
    }
  }

  log_delivery {
    worker_log_delivery {
      cloudwatch_logs {
        enabled   = true
        log_group = aws_cloudwatch_log_group.mirror[0].name
      }
    }
  }

  service_execution_role_arn = aws_iam_role.mirror[0].arn

  tags = local.tags
}
