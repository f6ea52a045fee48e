# Three regions, each with its own Redis Cluster, coordinators and MSK
# cluster; the MSK clusters mirror each other's topics with MirrorMaker 2.
# Sizes come from the seed design's capacity estimate; the arithmetic is in
# deploy/terraform/README.md.

locals {
  # The same list, in the same order, for every coordinator.
  regions = ["us-east-1", "eu-west-1", "ap-south-1"]

  # Must be equal in every region: epochs are aligned to multiples of it.
  epoch_seconds = 10

  # 1M decisions/s / 3 regions = 333 000 script calls/s per region;
  # / 80 000 per primary x 1.5 headroom = 6.3, rounded up to 8 primaries.
  # 4.8 GB of buckets / 8 = 0.6 GB per primary; one replica each.
  redis = {
    node_type               = "cache.m7g.large"
    num_node_groups         = 8
    replicas_per_node_group = 1
  }

  # Two tasks: a leader and a standby, one memberlist cluster per region.
  coordinator = {
    desired_count = 2
    cpu           = 1024
    memory        = 2048
  }

  # One broker per zone; worst case 40 MB/s in, one hour of usage reports.
  kafka = {
    broker_count           = 3
    broker_instance_type   = "kafka.m7g.large"
    broker_volume_size_gib = 200
  }
}

# ---------------------------------------------------------------- us-east-1

module "kafka_us_east_1" {
  source    = "../../modules/kafka"
  providers = { aws = aws.us_east_1 }

  name_prefix = var.name_prefix
  region      = "us-east-1"
  vpc_id      = var.networks["us-east-1"].vpc_id
  subnet_ids  = var.networks["us-east-1"].subnet_ids

  client_security_group_ids = [module.region_us_east_1.coordinator_security_group_id]
  peer_cidr_blocks          = [var.networks["eu-west-1"].vpc_cidr, var.networks["ap-south-1"].vpc_cidr]

  broker_count           = local.kafka.broker_count
  broker_instance_type   = local.kafka.broker_instance_type
  broker_volume_size_gib = local.kafka.broker_volume_size_gib

  # One cluster per region: mirror the other two regions' topics here.
  replication_sources = {
    "eu-west-1"  = module.kafka_eu_west_1.bootstrap_brokers_tls
    "ap-south-1" = module.kafka_ap_south_1.bootstrap_brokers_tls
  }
  mirror_plugin = var.mirror_plugins["us-east-1"]
}

module "region_us_east_1" {
  source    = "../../modules/region"
  providers = { aws = aws.us_east_1 }

  name_prefix = var.name_prefix
  region      = "us-east-1"
  regions     = local.regions

  vpc_id                        = var.networks["us-east-1"].vpc_id
  subnet_ids                    = var.networks["us-east-1"].subnet_ids
  gateway_security_group_ids    = var.networks["us-east-1"].gateway_security_group_ids
  monitoring_security_group_ids = var.networks["us-east-1"].monitoring_security_group_ids
  admin_security_group_ids      = var.networks["us-east-1"].admin_security_group_ids

  redis_node_type               = local.redis.node_type
  redis_num_node_groups         = local.redis.num_node_groups
  redis_replicas_per_node_group = local.redis.replicas_per_node_group

  coordinator_image         = var.coordinator_image
  coordinator_desired_count = local.coordinator.desired_count
  coordinator_cpu           = local.coordinator.cpu
  coordinator_memory        = local.coordinator.memory
  epoch_seconds             = local.epoch_seconds

  kafka_bootstrap_brokers = module.kafka_us_east_1.bootstrap_brokers_tls_list

  admin_tokens_secret_arn = var.admin_tokens_secret_arns["us-east-1"]

  # Transport security, the documented defaults: TLS to Redis and Kafka
  # (set by the module), HTTPS on the coordinators' listener from these
  # secrets, Redis AUTH where a token is given.
  coordinator_tls_cert_secret_arn = var.coordinator_tls_secret_arns["us-east-1"].cert
  coordinator_tls_key_secret_arn  = var.coordinator_tls_secret_arns["us-east-1"].key
  redis_auth_token_secret_arn     = lookup(var.redis_auth_token_secret_arns, "us-east-1", null)
}

# ---------------------------------------------------------------- eu-west-1

module "kafka_eu_west_1" {
  source    = "../../modules/kafka"
  providers = { aws = aws.eu_west_1 }

  name_prefix = var.name_prefix
  region      = "eu-west-1"
  vpc_id      = var.networks["eu-west-1"].vpc_id
  subnet_ids  = var.networks["eu-west-1"].subnet_ids

  client_security_group_ids = [module.region_eu_west_1.coordinator_security_group_id]
  peer_cidr_blocks          = [var.networks["us-east-1"].vpc_cidr, var.networks["ap-south-1"].vpc_cidr]

  broker_count           = local.kafka.broker_count
  broker_instance_type   = local.kafka.broker_instance_type
  broker_volume_size_gib = local.kafka.broker_volume_size_gib

  # One cluster per region: mirror the other two regions' topics here.
  replication_sources = {
    "us-east-1"  = module.kafka_us_east_1.bootstrap_brokers_tls
    "ap-south-1" = module.kafka_ap_south_1.bootstrap_brokers_tls
  }
  mirror_plugin = var.mirror_plugins["eu-west-1"]
}

module "region_eu_west_1" {
  source    = "../../modules/region"
  providers = { aws = aws.eu_west_1 }

  name_prefix = var.name_prefix
  region      = "eu-west-1"
  regions     = local.regions

  vpc_id                        = var.networks["eu-west-1"].vpc_id
  subnet_ids                    = var.networks["eu-west-1"].subnet_ids
  gateway_security_group_ids    = var.networks["eu-west-1"].gateway_security_group_ids
  monitoring_security_group_ids = var.networks["eu-west-1"].monitoring_security_group_ids
  admin_security_group_ids      = var.networks["eu-west-1"].admin_security_group_ids

  redis_node_type               = local.redis.node_type
  redis_num_node_groups         = local.redis.num_node_groups
  redis_replicas_per_node_group = local.redis.replicas_per_node_group

  coordinator_image         = var.coordinator_image
  coordinator_desired_count = local.coordinator.desired_count
  coordinator_cpu           = local.coordinator.cpu
  coordinator_memory        = local.coordinator.memory
  epoch_seconds             = local.epoch_seconds

  kafka_bootstrap_brokers = module.kafka_eu_west_1.bootstrap_brokers_tls_list

  admin_tokens_secret_arn = var.admin_tokens_secret_arns["eu-west-1"]

  # Transport security, the documented defaults: TLS to Redis and Kafka
  # (set by the module), HTTPS on the coordinators' listener from these
  # secrets, Redis AUTH where a token is given.
  coordinator_tls_cert_secret_arn = var.coordinator_tls_secret_arns["eu-west-1"].cert
  coordinator_tls_key_secret_arn  = var.coordinator_tls_secret_arns["eu-west-1"].key
  redis_auth_token_secret_arn     = lookup(var.redis_auth_token_secret_arns, "eu-west-1", null)
}

# ---------------------------------------------------------------- ap-south-1

module "kafka_ap_south_1" {
  source    = "../../modules/kafka"
  providers = { aws = aws.ap_south_1 }

  name_prefix = var.name_prefix
  region      = "ap-south-1"
  vpc_id      = var.networks["ap-south-1"].vpc_id
  subnet_ids  = var.networks["ap-south-1"].subnet_ids

  client_security_group_ids = [module.region_ap_south_1.coordinator_security_group_id]
  peer_cidr_blocks          = [var.networks["us-east-1"].vpc_cidr, var.networks["eu-west-1"].vpc_cidr]

  broker_count           = local.kafka.broker_count
  broker_instance_type   = local.kafka.broker_instance_type
  broker_volume_size_gib = local.kafka.broker_volume_size_gib

  # One cluster per region: mirror the other two regions' topics here.
  replication_sources = {
    "us-east-1" = module.kafka_us_east_1.bootstrap_brokers_tls
    "eu-west-1" = module.kafka_eu_west_1.bootstrap_brokers_tls
  }
  mirror_plugin = var.mirror_plugins["ap-south-1"]
}

module "region_ap_south_1" {
  source    = "../../modules/region"
  providers = { aws = aws.ap_south_1 }

  name_prefix = var.name_prefix
  region      = "ap-south-1"
  regions     = local.regions

  vpc_id                        = var.networks["ap-south-1"].vpc_id
  subnet_ids                    = var.networks["ap-south-1"].subnet_ids
  gateway_security_group_ids    = var.networks["ap-south-1"].gateway_security_group_ids
  monitoring_security_group_ids = var.networks["ap-south-1"].monitoring_security_group_ids
  admin_security_group_ids      = var.networks["ap-south-1"].admin_security_group_ids

  redis_node_type               = local.redis.node_type
  redis_num_node_groups         = local.redis.num_node_groups
  redis_replicas_per_node_group = local.redis.replicas_per_node_group

  coordinator_image         = var.coordinator_image
  coordinator_desired_count = local.coordinator.desired_count
  coordinator_cpu           = local.coordinator.cpu
  coordinator_memory        = local.coordinator.memory
  epoch_seconds             = local.epoch_seconds

  kafka_bootstrap_brokers = module.kafka_ap_south_1.bootstrap_brokers_tls_list

  admin_tokens_secret_arn = var.admin_tokens_secret_arns["ap-south-1"]

  # Transport security, the documented defaults: TLS to Redis and Kafka
  # (set by the module), HTTPS on the coordinators' listener from these
  # secrets, Redis AUTH where a token is given.
  coordinator_tls_cert_secret_arn = var.coordinator_tls_secret_arns["ap-south-1"].cert
  coordinator_tls_key_secret_arn  = var.coordinator_tls_secret_arns["ap-south-1"].key
  redis_auth_token_secret_arn     = lookup(var.redis_auth_token_secret_arns, "ap-south-1", null)
}
