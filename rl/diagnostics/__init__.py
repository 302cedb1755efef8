"""Diagnostics: the learner/rollout mismatch metrics (`mismatch`), the `minite diagnose` report (`gap_report`), and localizing a gap to its op (`localize`)."""
