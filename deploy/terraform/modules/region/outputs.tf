output "redis_configuration_endpoint" {
  description = "host:port of the Redis Cluster configuration endpoint; gateways of this region connect here (TLS)."
  value       = "${aws_elasticache_replication_group.this.configuration_endpoint_address}:${var.redis_port}"
}

output "redis_replication_group_id" {
  description = "ElastiCache replication group id of the regional Redis Cluster."
  value       = aws_elasticache_replication_group.this.id
}

output "redis_security_group_id" {
  description = "Security group of the Redis nodes."
  value       = aws_security_group.redis.id
}

output "coordinator_security_group_id" {
  description = "Security group of the coordinator tasks; give it access to Kafka."
  value       = aws_security_group.coordinator.id
}

output "ecs_cluster_arn" {
  description = "ECS cluster that runs the coordinators."
  value       = aws_ecs_cluster.this.arn
}

output "coordinator_service_name" {
  description = "ECS service name of the coordinators."
  value       = aws_ecs_service.coordinator.name
}

output "coordinator_task_definition_arn" {
  description = "Task definition (with revision) the coordinator service runs."
  value       = aws_ecs_task_definition.coordinator.arn
}

output "coordinator_log_group_name" {
  description = "CloudWatch log group of the coordinators."
  value       = aws_cloudwatch_log_group.coordinator.name
}

output "coordinator_environment" {
  description = "QUOTIENT_* settings passed to every coordinator task."
  value       = local.coordinator_env_all
}

output "coordinator_dns_name" {
  description = "DNS name with one A record per running coordinator task (Cloud Map, resolvable inside vpc_id): the replicas' gossip seed, and an address for the admin API."
  value       = local.coordinator_dns
}

output "coordinator_admin_url" {
  description = "Base URL of the admin API (any replica serves it), for the quotient CLI (--server) from a host in admin_security_group_ids."
  value       = "https://${local.coordinator_dns}:${var.coordinator_port}"
}

output "discovery_namespace_id" {
  description = "Id of the Cloud Map private DNS namespace of this region's coordinators."
  value       = aws_service_discovery_private_dns_namespace.this.id
}

output "coordinator_execution_role_name" {
  description = "Name of the coordinator task execution role (pulls the image, reads the admin-token secret); attach extra grants here, e.g. for an image registry in another account."
  value       = aws_iam_role.execution.name
}
