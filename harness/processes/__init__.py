"""What every service of the harness is made of: a managed process, a service started and stopped
with ``with``, its working directory, its command line, free ports and /proc.

Nothing here knows a cluster, a broker or the product: the rooms above build on it.
"""
