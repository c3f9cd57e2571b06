-- The indexes the fleet's queries from the store need
-- (docs/operating.md#the-state-store): an inventory page filtered by
-- environment or to failing nodes walks certnames in order; the gate's
-- counts join each node to what was served to it (served's primary key).
CREATE INDEX node_reports_env_certname ON node_reports (environment, certname);
CREATE INDEX node_reports_failing ON node_reports (certname) WHERE loads_failed > 0;
