"""The pre-registered analysis (preregistration/analysis.yaml): reading rule, scoring definitions, decision rules, bootstrap."""
