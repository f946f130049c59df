-- 0005: RESERVED on this branch only, so that migrations stay numbered 1..n here: the number
-- belongs to other work in flight (issue 16). Delete this file when merging that work.
SELECT 1;
