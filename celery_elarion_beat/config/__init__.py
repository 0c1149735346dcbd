"""What the user set: settings, DSNs, names, entry options, and the one reader of
``beat_schedule`` (:mod:`.entries`).

Everything here validates input and names the setting or entry at fault; nothing
here opens a connection.
"""
