# The coordinator: `quotient coordinator` as an ECS Fargate service. Its
# replicas form a memberlist cluster (discovery.tf) and the one with the
# smallest node name leads the epoch loop and the daily-quota replication;
# the others stand by. Every replica serves the admin API and materialises
# the policy log.

resource "aws_ecs_cluster" "this" {
  name = local.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  tags = local.tags
}

resource "aws_cloudwatch_log_group" "coordinator" {
  name              = "/quotient/${var.region}/coordinator"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

# Execution role: lets ECS pull the image and write the log stream.
resource "aws_iam_role" "execution" {
  name               = "${local.name}-coord-exec"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

# ECS reads the admin-token secret with the execution role, when it starts
# a task, and hands it to the admin-tokens container only.
data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadAdminTokens"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.task_secret_arns
  }

  dynamic "statement" {
    for_each = var.admin_tokens_kms_key_arn == null && length(var.secrets_kms_key_arns) == 0 ? [] : [compact(concat([var.admin_tokens_kms_key_arn], var.secrets_kms_key_arns))]
    content {
      sid       = "DecryptAdminTokens"
      actions   = ["kms:Decrypt"]
      resources = statement.value
    }
  }
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "admin-tokens"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

# Task role: the coordinator itself calls no AWS API today, so it has no
# policy; it exists so one can be attached without replacing the task.
resource "aws_iam_role" "task" {
  name               = "${local.name}-coord-task"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_ecs_task_definition" "coordinator" {
  family                   = "${local.name}-coordinator"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.coordinator_cpu
  memory                   = var.coordinator_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.coordinator_cpu_architecture
  }

  # Task-private scratch volume (Fargate ephemeral storage, encrypted at
  # rest): the admin-tokens container writes the token file into it, the
  # coordinator mounts it read-only. Nothing else mounts it.
  volume {
    name = "admin-tokens"
  }

  container_definitions = jsonencode([
    {
      # Runs first and exits: writes the admin API's bearer tokens (the
      # secret's value, lines of "<name> <read|admin> <token>") to the file
      # QUOTIENT_ADMIN_TOKENS_FILE names, since ECS injects secrets as
      # environment variables and the coordinator reads a file. The secret
      # is in this container's environment only, never the coordinator's.
      # It uses the quotient image for its shell (the health check below
      # needs one too) and runs as root, so it can write to the fresh
      # volume whichever user the image runs as; the file is made readable
      # (0444) by the coordinator's user.
      name       = "admin-tokens"
      image      = var.coordinator_image
      essential  = false
      user       = "0"
      entryPoint = ["sh", "-c"]
      # It writes the listener's certificate and key (and the admin
      # client CA, when set) the same way; the key is 0444 too, since the
      # volume is this task's alone and the coordinator's user must read it.
      command = [join(" && ", concat(
        ["umask 0222"],
        [for f in local.startup_files : format("printf '%%s\\n' \"$%s\" > '%s.tmp' && mv '%s.tmp' '%s'", f.env, f.path, f.path, f.path)],
      ))]

      secrets = [for f in local.startup_files : { name = f.env, valueFrom = f.secret }]

      mountPoints = [
        {
          sourceVolume  = "admin-tokens"
          containerPath = local.admin_tokens_dir
          readOnly      = false
        }
      ]

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.coordinator.name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = "admin-tokens"
        }
      }
    },
    {
      name      = "coordinator"
      image     = var.coordinator_image
      essential = true
      command   = ["coordinator"]

      # Start only once the token file is written.
      dependsOn = [
        {
          containerName = "admin-tokens"
          condition     = "SUCCESS"
        }
      ]

      mountPoints = [
        {
          sourceVolume  = "admin-tokens"
          containerPath = local.admin_tokens_dir
          readOnly      = true
        }
      ]

      environment = [
        for name in sort(keys(local.coordinator_env_all)) : {
          name  = name
          value = local.coordinator_env_all[name]
        }
      ]

      # Secrets as environment variables, never flags (ps would show a
      # flag's value): the Redis AUTH token and the MSK SCRAM credentials
      # (JSON keys of the AmazonMSK_ secret).
      secrets = concat(
        var.redis_auth_token_secret_arn == null ? [] : [
          { name = "QUOTIENT_REDIS_PASSWORD", valueFrom = var.redis_auth_token_secret_arn },
        ],
        var.kafka_sasl_scram_secret_arn == null ? [] : [
          { name = "QUOTIENT_KAFKA_SASL_USER", valueFrom = "${var.kafka_sasl_scram_secret_arn}:username::" },
          { name = "QUOTIENT_KAFKA_SASL_PASSWORD", valueFrom = "${var.kafka_sasl_scram_secret_arn}:password::" },
        ],
      )

      # Gossip uses both protocols on one port (memberlist: UDP probes and
      # gossip, TCP joins and state sync); on awsvpc the mappings document
      # the ports, the security group admits them.
      portMappings = [
        {
          name          = "http"
          containerPort = var.coordinator_port
          protocol      = "tcp"
          appProtocol   = "http"
        },
        {
          name          = "gossip-tcp"
          containerPort = var.gossip_port
          protocol      = "tcp"
        },
        {
          name          = "gossip-udp"
          containerPort = var.gossip_port
          protocol      = "udp"
        }
      ]

      # /healthz answers 200 while the process serves, over TLS: the
      # image must carry a wget that speaks HTTPS (busybox 1.33+ or
      # distroless/base-debug do). The certificate is for the service's
      # name, not 127.0.0.1, hence --no-check-certificate; /healthz needs
      # no client certificate.
      healthCheck = {
        command     = ["CMD-SHELL", "wget -q --no-check-certificate -O /dev/null https://127.0.0.1:${var.coordinator_port}/healthz || exit 1"]
        interval    = 10
        timeout     = 3
        retries     = 3
        startPeriod = 30
      }

      # SIGTERM first: the coordinator leaves the gossip cluster (the
      # others take over at once, without waiting for failure detection)
      # and flushes before it exits.
      stopTimeout = 30

      dockerLabels = {
        "prometheus.io/scrape" = "true"
        "prometheus.io/port"   = tostring(var.coordinator_port)
        "prometheus.io/path"   = "/metrics"
      }

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.coordinator.name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = "coordinator"
        }
      }
    }
  ])

  tags = local.tags
}

resource "aws_ecs_service" "coordinator" {
  name            = "coordinator"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.coordinator.arn
  desired_count   = var.coordinator_desired_count
  launch_type     = "FARGATE"

  # Never run fewer than half the replicas during a deploy, so a leader or
  # a standby is always up; ECS rolls back a deploy whose tasks fail their
  # health check.
  deployment_minimum_healthy_percent = 50
  deployment_maximum_percent         = 200

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.coordinator.id]
    assign_public_ip = false
  }

  # One A record per task under coordinator.<namespace>: the gossip seeds.
  service_registries {
    registry_arn = aws_service_discovery_service.coordinator.arn
  }

  propagate_tags = "SERVICE"
  tags           = local.tags
}
