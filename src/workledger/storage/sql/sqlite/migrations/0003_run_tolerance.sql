-- 0003: the failure tolerance a run was submitted under, so that its state
-- (completed_with_failures or failed) does not depend on which job definition the reader loaded.
-- A count of failed units when >= 1, a fraction of its units when below 1; NULL for runs
-- submitted before this migration (their job definition's tolerance applies, 0 without one).
ALTER TABLE wl_runs ADD COLUMN tolerate REAL;
