"""Time and the slots on it: pure functions, tested without a database.

The database's clock as a process estimates it (:mod:`.clock`), the timing
constants every layer shares (:mod:`.timing`), a crontab's wall-clock
instants (:mod:`.cron`), slot sequences and the missed-run policy
(:mod:`.slots`), sequences bounded by a start, an end, a count or one instant
(:mod:`.bounds`), a schedule's JSON form for the catalog
(:mod:`.catalog_form`), and the one rule of a live replica
(:mod:`.membership`). Nothing here imports the store, the configuration or a
host.
"""
