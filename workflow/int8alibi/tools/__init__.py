"""Commands that are not stages: int8alibi conform and int8alibi bench."""
