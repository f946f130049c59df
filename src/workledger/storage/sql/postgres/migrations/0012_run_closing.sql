-- 0012: whether the run's job declared a closing hook when the run was submitted, so that
-- prune, which reads the ledger alone, never deletes a complete run whose hook has not run yet
-- (its @close entry is written only when the sweeper first comes to run it). True or false
-- from now on; for older runs true where a run of the same job has a closing entry, NULL
-- otherwise (the loaded app's declaration then applies, when prune is given one).
ALTER TABLE wl_runs ADD COLUMN closing boolean;
UPDATE wl_runs SET closing = true
WHERE job IN (SELECT r.job FROM wl_runs AS r
              WHERE EXISTS (SELECT 1 FROM wl_items AS i
                            WHERE i.run_id = r.id AND i.stage = '@close'));
