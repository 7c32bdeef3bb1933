"""Advantage estimators, policy losses, KL estimators, DAPO helpers and rollout correction: pure tensor functions."""
