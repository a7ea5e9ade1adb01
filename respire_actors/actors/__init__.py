"""The actors of a job worker, one concern per module.

admission  local capacity (permits) taken before Redis is asked for work
reader     admits never-delivered entries (one script call per batch), waits outside scripts
sweeper    startup replay of own pending entries, then bounded recovery passes; idle consumers
intake     what reader and sweeper share: page dispatch, a vanished group, jitter
tree       the consumer supervisor; its first child (membership) runs the start-up checks
runner     runs handlers, each in its own cancel scope owned by the delivery's lease
completer  commits many outcomes per script call, fenced by consumer and attempt
"""
