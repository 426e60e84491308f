"""The team catalog's schema in PostgreSQL, as numbered migrations, and who may see what.

The site's admin applies them (``fleet team migrate``, as the role that owns the schema); every
other person's fleet only reads ``fleet.schema_version`` and refuses a catalog that is older (ask
the admin) or newer (upgrade fleet) than it knows.

Who sees what is PostgreSQL's row-level security, so that it holds through ``psql`` as through
fleet:
* a run is its owner's (``owner``, the role that pushed it: ``DEFAULT current_user`` and checked on
  every insert and update, so nobody files a run under another name);
* a person sees their own runs, the runs shared with a group role they are a member of, and all of
  them when they are a member of ``fleet_admin``;
* a run's reports, kernels, metrics and shares are visible exactly when the run is, and written only
  by its owner.
The visibility rule is one function, :data:`CAN_SEE`, used by the policies and by the function that
hands out an object's address (``fleet.object_url``), which signs a short-lived S3 URL (SigV4,
pgcrypto) with a reader key that only the schema's owner can read: a person reads another's shared
report through it, and never with their own S3 keys, which reach their own prefix alone.
"""

from __future__ import annotations

# Every key fleet writes is made of these characters ("/" between words): the URL signed in SQL
# needs no percent-encoding, and a key of any other character is refused there.
KEY_CHARACTERS = "A-Za-z0-9._/-"

CAN_SEE = """
CREATE FUNCTION fleet.can_see(p_owner name, p_run text, p_who name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, fleet AS $$
  SELECT p_owner = p_who
      OR pg_has_role(p_who, 'fleet_admin', 'MEMBER')
      OR EXISTS (SELECT 1 FROM fleet.run_shares s
                  WHERE s.run_id = p_run AND pg_has_role(p_who, s.grp, 'MEMBER'))
$$;
"""

TABLES = """
CREATE TABLE fleet.runs (
  run_id text PRIMARY KEY,
  owner name NOT NULL DEFAULT current_user,
  site text NOT NULL, day text NOT NULL, started text NOT NULL,
  tool text, command jsonb, status text NOT NULL,
  manifest jsonb NOT NULL, manifest_sha256 text NOT NULL,
  pushed_from text,
  pushed_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX runs_started ON fleet.runs (started);
CREATE INDEX runs_owner ON fleet.runs (owner, started);
CREATE TABLE fleet.run_shares (
  run_id text NOT NULL REFERENCES fleet.runs ON DELETE CASCADE,
  grp name NOT NULL,
  PRIMARY KEY (run_id, grp));
CREATE TABLE fleet.reports (
  run_id text NOT NULL REFERENCES fleet.runs ON DELETE CASCADE,
  host text NOT NULL, name text NOT NULL, tool text, status text NOT NULL,
  sha256 text, size bigint, gpu text, driver text, tool_version text, started text NOT NULL,
  object_key text,
  PRIMARY KEY (run_id, host, name));
CREATE INDEX reports_started ON fleet.reports (started, host, name);
CREATE INDEX reports_host ON fleet.reports (host, started);
CREATE TABLE fleet.kernels (
  run_id text NOT NULL REFERENCES fleet.runs ON DELETE CASCADE,
  host text NOT NULL, name text NOT NULL, total_ns bigint NOT NULL, instances bigint NOT NULL);
CREATE INDEX kernels_run ON fleet.kernels (run_id);
CREATE TABLE fleet.metrics (
  run_id text NOT NULL REFERENCES fleet.runs ON DELETE CASCADE,
  playbook text, metric text NOT NULL, device text NOT NULL, value double precision NOT NULL,
  flags jsonb NOT NULL, started text NOT NULL);
CREATE INDEX metrics_playbook ON fleet.metrics (playbook, started);
"""

POLICIES = """
ALTER TABLE fleet.runs ENABLE ROW LEVEL SECURITY;
-- owner = current_user first: a person's own rows never call the function (which cannot be inlined)
CREATE POLICY runs_read ON fleet.runs FOR SELECT
  USING (owner = current_user OR fleet.can_see(owner, run_id, current_user));
CREATE POLICY runs_add ON fleet.runs FOR INSERT WITH CHECK (owner = current_user);
CREATE POLICY runs_change ON fleet.runs FOR UPDATE USING (owner = current_user)
  WITH CHECK (owner = current_user);
CREATE POLICY runs_remove ON fleet.runs FOR DELETE
  USING (owner = current_user OR pg_has_role(current_user, 'fleet_admin', 'MEMBER'));
"""

# The tables below a run: seen with the run, written by its owner.
CHILD_POLICY = """
ALTER TABLE fleet.{t} ENABLE ROW LEVEL SECURITY;
CREATE POLICY {t}_read ON fleet.{t} FOR SELECT
  USING (EXISTS (SELECT 1 FROM fleet.runs r WHERE r.run_id = {t}.run_id));
CREATE POLICY {t}_write ON fleet.{t} FOR ALL
  USING (EXISTS (SELECT 1 FROM fleet.runs r WHERE r.run_id = {t}.run_id AND r.owner = current_user))
  WITH CHECK (EXISTS (SELECT 1 FROM fleet.runs r WHERE r.run_id = {t}.run_id
    AND r.owner = current_user));
"""

SHARE_RULE = """
CREATE POLICY run_shares_only_own_groups ON fleet.run_shares AS RESTRICTIVE FOR INSERT
  WITH CHECK (pg_has_role(current_user, grp, 'MEMBER'));
"""

SIGNER = """
CREATE SCHEMA fleet_private;
REVOKE ALL ON SCHEMA fleet_private FROM PUBLIC;
CREATE TABLE fleet_private.signer (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  endpoint text NOT NULL, region text NOT NULL, bucket text NOT NULL,
  access_key text NOT NULL, secret_key text NOT NULL);
CREATE FUNCTION fleet_private.hmac256(key bytea, message text) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fleet_private AS $$
  SELECT fleet_private.hmac(convert_to(message, 'UTF8'), key, 'sha256')
$$;
CREATE FUNCTION fleet.object_url(p_run text, p_key text, p_expires integer DEFAULT 900) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, fleet, fleet_private AS $$
DECLARE
  s fleet_private.signer;
  stamp text := to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS"Z"');
  day text := to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD');
  scope text; host text; path text; query text; canonical text; to_sign text; k bytea;
BEGIN
  IF p_key !~ '^[KEYCHARS]+$' OR p_key ~ '(^|/)\\.\\.?(/|$)' THEN
    RAISE EXCEPTION 'not an object key fleet writes: %', left(p_key, 80);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fleet.runs r JOIN fleet.reports p ON p.run_id = r.run_id
                  WHERE r.run_id = p_run AND p.object_key = p_key
                    AND fleet.can_see(r.owner, r.run_id, session_user)) THEN
    RAISE EXCEPTION 'no report % of run % that you may read', left(p_key, 80), left(p_run, 80);
  END IF;
  SELECT * INTO STRICT s FROM fleet_private.signer;
  host := regexp_replace(s.endpoint, '^https?://([^/]+).*$', '\\1');
  path := '/' || s.bucket || '/' || p_key;
  scope := day || '/' || s.region || '/s3/aws4_request';
  query := 'X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=' || s.access_key || '%2F'
           || replace(scope, '/', '%2F') || '&X-Amz-Date=' || stamp || '&X-Amz-Expires='
           || least(greatest(p_expires, 1), 3600) || '&X-Amz-SignedHeaders=host';
  canonical := 'GET' || chr(10) || path || chr(10) || query || chr(10) || 'host:' || host || chr(10)
               || chr(10) || 'host' || chr(10) || 'UNSIGNED-PAYLOAD';
  to_sign := 'AWS4-HMAC-SHA256' || chr(10) || stamp || chr(10) || scope || chr(10)
             || encode(fleet_private.digest(convert_to(canonical, 'UTF8'), 'sha256'), 'hex');
  k := fleet_private.hmac256(convert_to('AWS4' || s.secret_key, 'UTF8'), day);
  k := fleet_private.hmac256(k, s.region);
  k := fleet_private.hmac256(k, 's3');
  k := fleet_private.hmac256(k, 'aws4_request');
  RETURN regexp_replace(s.endpoint, '/+$', '') || path || '?' || query || '&X-Amz-Signature='
         || encode(fleet_private.hmac256(k, to_sign), 'hex');
END $$;
""".replace("KEYCHARS", KEY_CHARACTERS)

GRANTS = """
GRANT USAGE ON SCHEMA fleet TO fleet_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fleet TO fleet_user;
REVOKE ALL ON FUNCTION fleet.object_url(text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fleet.object_url(text, text, integer) TO fleet_user;
GRANT EXECUTE ON FUNCTION fleet.can_see(name, text, name) TO fleet_user;
"""

# Migration N brings the catalog from version N-1 to N. Roles fleet_user and fleet_admin are the
# site's (docs/team-store.md makes them); the migrations only use them.
MIGRATIONS: list[str] = [
    "CREATE SCHEMA fleet;\n"
    "CREATE TABLE fleet.schema_version (one boolean PRIMARY KEY DEFAULT true CHECK (one), version "
    "integer NOT NULL);\nINSERT INTO fleet.schema_version (version) VALUES (0);\n"
    "GRANT USAGE ON SCHEMA fleet TO fleet_user;\nGRANT SELECT ON fleet.schema_version TO "
    "fleet_user;\n"
    + TABLES + CAN_SEE + POLICIES
    + "".join(CHILD_POLICY.format(t=t) for t in ("reports", "kernels", "metrics", "run_shares"))
    + SHARE_RULE
    + SIGNER.replace("CREATE SCHEMA fleet_private;", "CREATE SCHEMA fleet_private;\n"
                     "CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA fleet_private;")
    + GRANTS,
]
VERSION = len(MIGRATIONS)
