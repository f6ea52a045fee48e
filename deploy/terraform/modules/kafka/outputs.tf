output "cluster_arn" {
  description = "ARN of the MSK cluster."
  value       = aws_msk_cluster.this.arn
}

output "bootstrap_brokers_tls" {
  description = "TLS bootstrap brokers of this cluster, comma-separated host:port (port 9094)."
  value       = aws_msk_cluster.this.bootstrap_brokers_tls
}

output "bootstrap_brokers_tls_list" {
  description = "TLS bootstrap brokers of this cluster as a list of host:port, for the region module's kafka_bootstrap_brokers."
  value       = split(",", aws_msk_cluster.this.bootstrap_brokers_tls)
}

output "bootstrap_brokers_sasl_scram_list" {
  description = "SASL/SCRAM bootstrap brokers (TLS, port 9096) as a list of host:port, for the region module's kafka_bootstrap_brokers when sasl_scram_secret_arns is set; empty otherwise."
  value       = length(var.sasl_scram_secret_arns) > 0 ? split(",", aws_msk_cluster.this.bootstrap_brokers_sasl_scram) : []
}

output "security_group_id" {
  description = "Security group of the brokers."
  value       = aws_security_group.kafka.id
}

output "topics" {
  description = "The topics the coordinators need: name => partitions and topic configs."
  value       = local.topics
}

output "consumed_topics" {
  description = "Topics a coordinator of this region reads, per logical topic: the local topic plus <source region>.<topic> for every mirrored region."
  value       = local.consumed_topics
}

output "create_topic_commands" {
  description = "kafka-topics.sh commands that create the topics by hand after apply (the coordinators create them at start anyway). Run from a host inside the VPC with a client.properties holding security.protocol=SSL."
  value = [
    for name, t in local.topics : join(" ", concat(
      [
        "kafka-topics.sh --bootstrap-server ${aws_msk_cluster.this.bootstrap_brokers_tls}",
        "--command-config client.properties --create --if-not-exists",
        "--topic ${name} --partitions ${t.partitions} --replication-factor 3",
      ],
      [for k in sort(keys(t.config)) : "--config ${k}=${t.config[k]}"],
    ))
  ]
}

output "mirror_connector_arns" {
  description = "MirrorMaker 2 connector ARNs, by source region; empty with one shared cluster."
  value       = { for source, c in aws_mskconnect_connector.mirror : source => c.arn }
}
