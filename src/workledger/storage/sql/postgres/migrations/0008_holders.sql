-- 0008: the holder of a claimed item, as on SQLite (docs/design.md,
-- "Leases: the holder's life, not the clocks"). On
-- PostgreSQL every lease is judged by the server's one clock and claims leave it NULL; the
-- column keeps both dialects' tables alike. Nullable, no default: no table rewrite.
ALTER TABLE wl_items ADD COLUMN holder text;
