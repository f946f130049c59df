-- 0005: a PLACEHOLDER in the i16-dispatch branch only. Migration 0005 belongs to the rate
-- limits work in flight (0005_stage_limits.sql); migrations must be numbered 1..n, so this
-- branch carries an empty one to apply its 0006. When the branches merge, take the real file.
SELECT 1;
