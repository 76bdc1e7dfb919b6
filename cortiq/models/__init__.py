"""Model forwards, one module per architecture (dory, deepseek_v4), plus their configs."""
