"""Ray placement groups, actor groups and the RolloutManager actor. No RL math lives here."""
