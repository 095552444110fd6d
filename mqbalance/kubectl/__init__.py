"""``kubectl mqbalance``, the kubectl plugin for people: views of a group (views.py, pure) and the
command that reads them from the API server (main.py)."""
