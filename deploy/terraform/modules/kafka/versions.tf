terraform {
  # 1.9 lets a validation block refer to other variables (mirroring needs
  # the plugin location).
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}
