"""pd-operator: reconciles PDDeployment resources into prefill/decode/proxy pods."""
