# The topics the coordinators need. Terraform does not create them: the
# coordinators create them at start (idempotent CreateTopics with exactly
# these configs, internal/kafkautil), and the output create_topic_commands
# gives the same as kafka-topics.sh commands for operators who create them
# by hand after apply. See README.md for why not the Mongey/kafka provider.

locals {
  topics = {
    # One usage report per region per epoch, split into parts; keyed by
    # region so one region's reports stay ordered. Only recent epochs
    # matter. max(3, key_parts) partitions, as the coordinators create it:
    # each key part's reports go to partition part mod n and its consumer
    # reads only that one (fewer partitions still work, with parts sharing
    # partitions). A topic that exists keeps its partitions: add them
    # with kafka-topics.sh --alter before raising key_parts.
    "quotient.usage" = {
      partitions = max(3, var.key_parts)
      config = {
        "cleanup.policy"      = "delete"
        "retention.ms"        = tostring(var.usage_retention_hours * 3600000)
        "min.insync.replicas" = "2"
        "max.message.bytes"   = "1048576"
      }
    }

    # Asks and gives of share between epoch decisions (issue 17), keyed by
    # the sending region; each is worth about a second, so little is kept.
    "quotient.usage-transfers" = {
      partitions = 3
      config = {
        "cleanup.policy"      = "delete"
        "retention.ms"        = "3600000"
        "min.insync.replicas" = "2"
        "max.message.bytes"   = "1004096"
      }
    }

    # Each region's absolute admitted count per (subject, policy, day);
    # compacted so the latest count per key survives, and deleted three
    # days after the window so old days do not pile up.
    "quotient.daily-quota" = {
      partitions = 12
      config = {
        "cleanup.policy"      = "compact,delete"
        "retention.ms"        = "259200000"
        "min.insync.replicas" = "2"
      }
    }

    # Versioned policies and overrides, the durable log every region
    # materialises; compacted, never expired. One partition: tiny volume,
    # and one total order makes history and rollback simple.
    "quotient.policies" = {
      partitions = 1
      config = {
        "cleanup.policy"      = "compact"
        "retention.ms"        = "-1"
        "min.insync.replicas" = "2"
      }
    }
  }

  # Topics a coordinator of this region reads: the local ones and, with
  # MirrorMaker 2 (DefaultReplicationPolicy), <source region>.<topic> for
  # every mirrored source.
  consumed_topics = {
    for topic in keys(local.topics) : topic => concat(
      [topic],
      [for source in sort(keys(var.replication_sources)) : "${source}.${topic}"],
    )
  }
}
