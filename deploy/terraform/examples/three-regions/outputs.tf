output "redis_endpoints" {
  description = "Per region, the Redis Cluster configuration endpoint (host:port, TLS) the gateways of that region use."
  value = {
    "us-east-1"  = module.region_us_east_1.redis_configuration_endpoint
    "eu-west-1"  = module.region_eu_west_1.redis_configuration_endpoint
    "ap-south-1" = module.region_ap_south_1.redis_configuration_endpoint
  }
}

output "kafka_bootstrap_brokers" {
  description = "Per region, the TLS bootstrap brokers of that region's MSK cluster."
  value = {
    "us-east-1"  = module.kafka_us_east_1.bootstrap_brokers_tls
    "eu-west-1"  = module.kafka_eu_west_1.bootstrap_brokers_tls
    "ap-south-1" = module.kafka_ap_south_1.bootstrap_brokers_tls
  }
}

output "create_topic_commands" {
  description = "Per region, kafka-topics.sh commands for creating the topics by hand (optional: the coordinators create them)."
  value = {
    "us-east-1"  = module.kafka_us_east_1.create_topic_commands
    "eu-west-1"  = module.kafka_eu_west_1.create_topic_commands
    "ap-south-1" = module.kafka_ap_south_1.create_topic_commands
  }
}

output "coordinator_services" {
  description = "Per region, the ECS cluster ARN and service name of the coordinators."
  value = {
    "us-east-1"  = { cluster = module.region_us_east_1.ecs_cluster_arn, service = module.region_us_east_1.coordinator_service_name }
    "eu-west-1"  = { cluster = module.region_eu_west_1.ecs_cluster_arn, service = module.region_eu_west_1.coordinator_service_name }
    "ap-south-1" = { cluster = module.region_ap_south_1.ecs_cluster_arn, service = module.region_ap_south_1.coordinator_service_name }
  }
}

output "coordinator_admin_urls" {
  description = "Per region, the base URL of the admin API (any coordinator replica serves it; the name resolves inside that region's VPC)."
  value = {
    "us-east-1"  = module.region_us_east_1.coordinator_admin_url
    "eu-west-1"  = module.region_eu_west_1.coordinator_admin_url
    "ap-south-1" = module.region_ap_south_1.coordinator_admin_url
  }
}
