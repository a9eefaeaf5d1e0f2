"""What several lessons run with: an engine run on a fixed step cost (``serving_run``), a sweep's settings
(``sweep_settings``) and the progress protocol a panel's bar listens to (``progress``)."""
