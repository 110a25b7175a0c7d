"""Process plumbing the services share: cache paths, first-start work under a file lock.

The ground floor: it imports nothing from the services or from ``splitspec`` (the top floor),
and nothing here imports torch, so the router may use it too.
"""
