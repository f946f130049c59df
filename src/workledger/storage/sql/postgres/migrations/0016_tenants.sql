-- 0016: tenants and their shares (docs/design.md, "Claim order"). A run's tenant (NULL: the
-- default tenant, named 'default', which every run before this migration is in); among the
-- runs of one priority, claims rotate across the tenants with claimable work, each tenant's
-- share in proportion to its weight. wl_tenants holds the weights set (a tenant without a row
-- weighs 1), with who set each last and why (set_tenant_weight is an operator command).
ALTER TABLE wl_runs ADD COLUMN tenant text;
CREATE TABLE wl_tenants (
    name text PRIMARY KEY,
    weight integer NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_by text,
    note text
);
