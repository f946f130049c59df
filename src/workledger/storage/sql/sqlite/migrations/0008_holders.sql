-- 0008: the holder of a claimed item (docs/design.md,
-- "Leases: the holder's life, not the clocks"). On SQLite every holder
-- is on the file's host, which tells whether it is alive (a locked file per worker beside the
-- ledger, storage/holders.py): an item claimed under a holder is taken back when its holder is
-- gone, at once, and never while it is alive, whatever the clocks of the processes say. NULL:
-- claimed without a holder (by hand, by a broker task, by an older version): its lease is
-- judged by the clock as before. Nullable, no default: no table rewrite.
ALTER TABLE wl_items ADD COLUMN holder TEXT;
