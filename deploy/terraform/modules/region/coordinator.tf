# The coordinator: `quotient coordinator` as an ECS Fargate service. Its
# replicas elect a leader for the epoch loop; the others stand by.

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

  container_definitions = jsonencode([
    {
      name      = "coordinator"
      image     = var.coordinator_image
      essential = true
      command   = ["coordinator"]

      environment = [
        for name in sort(keys(local.coordinator_env)) : {
          name  = name
          value = local.coordinator_env[name]
        }
      ]

      portMappings = [
        {
          name          = "http"
          containerPort = var.coordinator_port
          protocol      = "tcp"
          appProtocol   = "http"
        }
      ]

      # /healthz answers 200 while the process serves; the image must
      # carry wget (busybox or distroless/base-debug do).
      healthCheck = {
        command     = ["CMD-SHELL", "wget -q -O /dev/null http://127.0.0.1:${var.coordinator_port}/healthz || exit 1"]
        interval    = 10
        timeout     = 3
        retries     = 3
        startPeriod = 30
      }

      # SIGTERM first: the coordinator hands over leadership and flushes
      # before it exits.
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

  propagate_tags = "SERVICE"
  tags           = local.tags
}
