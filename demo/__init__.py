"""``make demo``: the whole system on one machine, shown to a person step by step."""
