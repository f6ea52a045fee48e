# Plan-and-apply against a mocked AWS provider (no credentials, no cloud):
# the coordinator's gossip and control-plane settings, the admin-tokens
# start-up command, the gossip security-group rules, and the validation of
# the new inputs. Needs the terraform binary and the AWS provider, so it is
# not part of scripts/terraform-check.sh:
#
#   cd deploy/terraform/modules/region
#   terraform init -backend=false && terraform test
#
# (with a local provider mirror: terraform init -plugin-dir=DIR ...)

mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/mock" }
  }
  mock_resource "aws_service_discovery_service" {
    defaults = { arn = "arn:aws:servicediscovery:us-east-1:123456789012:service/srv-mock" }
  }
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
}

variables {
  region                     = "us-east-1"
  regions                    = ["us-east-1", "eu-west-1"]
  vpc_id                     = "vpc-0abc"
  subnet_ids                 = ["subnet-01", "subnet-02"]
  gateway_security_group_ids = ["sg-01"]
  coordinator_image          = "repo/quotient:v1"
  kafka_bootstrap_brokers    = ["b-1:9094"]
  admin_tokens_secret_arn    = "arn:aws:secretsmanager:us-east-1:123456789012:secret:quotient-admin-AbCdEf"

  coordinator_tls_cert_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:quotient-tls-cert-AbCdEf"
  coordinator_tls_key_secret_arn  = "arn:aws:secretsmanager:us-east-1:123456789012:secret:quotient-tls-key-AbCdEf"
}

run "settings" {
  command = apply
  assert {
    condition     = output.coordinator_environment["QUOTIENT_GOSSIP_SEEDS"] == "127.0.0.1:7946,coordinator.quotient-us-east-1.internal:7946"
    error_message = "seeds: ${output.coordinator_environment["QUOTIENT_GOSSIP_SEEDS"]}"
  }
  assert {
    condition     = output.coordinator_environment["QUOTIENT_GOSSIP_BIND"] == "0.0.0.0:7946"
    error_message = "bind"
  }
  assert {
    condition     = output.coordinator_environment["QUOTIENT_ADMIN_TOKENS_FILE"] == "/run/quotient/admin-tokens"
    error_message = "tokens"
  }
  assert {
    condition     = length(jsondecode(aws_ecs_task_definition.coordinator.container_definitions)) == 2
    error_message = "containers"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.coordinator.container_definitions)[0].command[0] == "umask 0222 && printf '%s\\n' \"$ADMIN_TOKENS\" > '/run/quotient/admin-tokens.tmp' && mv '/run/quotient/admin-tokens.tmp' '/run/quotient/admin-tokens' && printf '%s\\n' \"$LISTEN_TLS_CERT\" > '/run/quotient/listen-cert.pem.tmp' && mv '/run/quotient/listen-cert.pem.tmp' '/run/quotient/listen-cert.pem' && printf '%s\\n' \"$LISTEN_TLS_KEY\" > '/run/quotient/listen-key.pem.tmp' && mv '/run/quotient/listen-key.pem.tmp' '/run/quotient/listen-key.pem'"
    error_message = "cmd: ${jsondecode(aws_ecs_task_definition.coordinator.container_definitions)[0].command[0]}"
  }
  assert {
    condition     = output.coordinator_environment["QUOTIENT_REDIS_TLS"] == "true" && output.coordinator_environment["QUOTIENT_KAFKA_TLS"] == "true"
    error_message = "redis and kafka TLS"
  }
  assert {
    condition     = output.coordinator_environment["QUOTIENT_LISTEN_TLS_CERT"] == "/run/quotient/listen-cert.pem" && output.coordinator_environment["QUOTIENT_LISTEN_TLS_KEY"] == "/run/quotient/listen-key.pem"
    error_message = "listener TLS"
  }
  assert {
    condition     = !contains(keys(output.coordinator_environment), "QUOTIENT_KAFKA_SASL")
    error_message = "no SCRAM without kafka_sasl_scram_secret_arn"
  }
  assert {
    condition     = toset(keys(aws_vpc_security_group_ingress_rule.coordinator_gossip)) == toset(["tcp", "udp"])
    error_message = "gossip rules"
  }
  assert {
    condition     = output.coordinator_admin_url == "https://coordinator.quotient-us-east-1.internal:9090"
    error_message = "url"
  }
}

run "custom_namespace" {
  command = plan
  variables {
    discovery_namespace = "coord.prod.example"
    gossip_port         = 8301
  }
  assert {
    condition     = output.coordinator_environment["QUOTIENT_GOSSIP_SEEDS"] == "127.0.0.1:8301,coordinator.coord.prod.example:8301"
    error_message = "seeds"
  }
}

run "bad_namespace" {
  command = plan
  variables {
    discovery_namespace = "Not A Domain"
  }
  expect_failures = [var.discovery_namespace]
}

run "gossip_eq_http" {
  command = plan
  variables {
    gossip_port = 9090
  }
  expect_failures = [var.gossip_port]
}

run "bad_secret" {
  command = plan
  variables {
    admin_tokens_secret_arn = "quotient-admin"
  }
  expect_failures = [var.admin_tokens_secret_arn]
}

run "bad_kms" {
  command = plan
  variables {
    admin_tokens_kms_key_arn = "alias/foo"
  }
  expect_failures = [var.admin_tokens_kms_key_arn]
}

run "kms_ok" {
  command = apply
  variables {
    admin_tokens_kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
  }
}
