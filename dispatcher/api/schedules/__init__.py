"""Recurring jobs, all in one place: `slots` (when a cron expression or an interval falls, DST
included), `declarations` (the `Schedule` that `registry.schedule` checks and returns),
`round` (one queue's round: enqueue the slots due ahead, the missed ones by catch_up),
`scheduler` (the worker's service that holds a queue's lease and runs its rounds) and `listing`
(`dispatcher.admin.list_schedules`). `dispatcher schedules list` is in dispatcher/cli/schedules.py.

Under api/ because the app declares schedules through the registry; everything here imports only
api/ and the layers below it (tests/unit/test_layering.py).
"""
