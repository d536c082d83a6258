//! Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
//! A migration is never edited once released: add a new one.

pub const MIGRATIONS: &[&str] = &[
    // 1: organisations, users and groups, records and activities, tags, relations, quota.
    r#"
CREATE TABLE organizations (
    id   TEXT PRIMARY KEY,
    name TEXT NOT NULL
);

-- Users and groups share one id space: an ownership or assignedto id names either.
CREATE TABLE principals (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    org             TEXT NOT NULL REFERENCES organizations(id),
    kind            INTEGER NOT NULL CHECK (kind IN (1, 2)),   -- 1 user, 2 group
    name            TEXT NOT NULL,
    email           TEXT NOT NULL DEFAULT '',
    token_sha256    BLOB,                                      -- users: SHA-256 of the API token
    admin           INTEGER NOT NULL DEFAULT 0,
    prevent_login   INTEGER NOT NULL DEFAULT 0,
    prevent_private INTEGER NOT NULL DEFAULT 0,
    deleted         INTEGER NOT NULL DEFAULT 0,
    created         INTEGER NOT NULL
);
CREATE UNIQUE INDEX principals_user_email ON principals (email COLLATE NOCASE) WHERE kind = 1;

CREATE TABLE memberships (
    group_id INTEGER NOT NULL REFERENCES principals(id),
    user_id  INTEGER NOT NULL REFERENCES principals(id),
    PRIMARY KEY (group_id, user_id)
) WITHOUT ROWID;
CREATE INDEX memberships_user ON memberships (user_id);

-- Records and activities: one table, one id space. A record has parent NULL and record_id = id;
-- an activity has its parent (record or activity) and the id of the record at its root.
CREATE TABLE items (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    org         TEXT NOT NULL REFERENCES organizations(id),
    typeid      INTEGER NOT NULL,
    record_id   INTEGER REFERENCES items(id),
    parent      INTEGER REFERENCES items(id),
    ownership   INTEGER NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    fields      TEXT NOT NULL DEFAULT '{}',                    -- JSON object: field name -> text
    search      TEXT NOT NULL DEFAULT '',                      -- lower-cased name and values, each after a 0x1F
    flagged     INTEGER NOT NULL DEFAULT 0,
    position    INTEGER NOT NULL DEFAULT 0,
    level       INTEGER NOT NULL DEFAULT 0,
    due         TEXT,                                          -- activities: their date (YYYY-MM-DD), see model
    completed   INTEGER NOT NULL DEFAULT 0,
    completed_at INTEGER,                                      -- when `completed` last became 1
    created     INTEGER NOT NULL,
    updated     INTEGER NOT NULL,
    viewed      INTEGER,
    creator     INTEGER NOT NULL,
    modificator INTEGER NOT NULL,
    archived    INTEGER                                        -- NULL active; else the id whose delete archived it
);
-- Lists: live (archived IS NULL) or archived records of a type, in name order.
CREATE INDEX items_records ON items (org, typeid, archived, name COLLATE NOCASE, id) WHERE parent IS NULL;
CREATE INDEX items_parent ON items (parent, position) WHERE parent IS NOT NULL;
CREATE INDEX items_record ON items (record_id) WHERE parent IS NOT NULL;
-- Reports and the due filters: activities of a type by date, by creation, by change.
CREATE INDEX items_due ON items (org, typeid, due) WHERE due IS NOT NULL;
CREATE INDEX items_activity_created ON items (org, typeid, created) WHERE parent IS NOT NULL;
CREATE INDEX items_activity_updated ON items (org, typeid, updated) WHERE parent IS NOT NULL;

CREATE TABLE categories (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    org         TEXT NOT NULL REFERENCES organizations(id),
    record_type INTEGER NOT NULL,
    name        TEXT NOT NULL,
    created     INTEGER NOT NULL,
    creator     INTEGER NOT NULL
);
CREATE UNIQUE INDEX categories_name ON categories (org, record_type, name COLLATE NOCASE);

CREATE TABLE item_categories (
    item_id     INTEGER NOT NULL REFERENCES items(id),
    category_id INTEGER NOT NULL REFERENCES categories(id),
    PRIMARY KEY (item_id, category_id)
) WITHOUT ROWID;
CREATE INDEX item_categories_category ON item_categories (category_id);

-- Related items: `item` links to `related` with a note; shown on `item`.
CREATE TABLE relations (
    id      INTEGER PRIMARY KEY,
    item    INTEGER NOT NULL REFERENCES items(id),
    related INTEGER NOT NULL REFERENCES items(id),
    note    TEXT NOT NULL DEFAULT '',
    UNIQUE (item, related)
);
CREATE INDEX relations_related ON relations (related);

-- Uploaded files of file, photo and attachment activities (the content lives in the database,
-- written in the same transaction as the activity).
CREATE TABLE files (
    item_id      INTEGER PRIMARY KEY REFERENCES items(id),
    name         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    size         INTEGER NOT NULL,
    sha256       BLOB NOT NULL,
    content      BLOB NOT NULL
);

-- API calls per user per clock hour (hour = Unix seconds / 3600), written at intervals.
CREATE TABLE quota (
    user_id INTEGER NOT NULL,
    hour    INTEGER NOT NULL,
    used    INTEGER NOT NULL,
    PRIMARY KEY (user_id, hour)
) WITHOUT ROWID;
"#,
    // 2: webhooks and their outbox.
    r#"
CREATE TABLE hooks (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    org            TEXT NOT NULL REFERENCES organizations(id),
    owner          INTEGER NOT NULL REFERENCES principals(id),
    type           TEXT NOT NULL DEFAULT 'web',
    title          TEXT NOT NULL DEFAULT '',
    active         INTEGER NOT NULL DEFAULT 1,
    event          TEXT NOT NULL,
    constrainttype TEXT NOT NULL DEFAULT 'all',
    url            TEXT NOT NULL,
    contenttype    TEXT NOT NULL DEFAULT 'xml',
    secret         TEXT NOT NULL DEFAULT '',
    paused         INTEGER NOT NULL DEFAULT 0,                 -- backlog over the limit: not fed
    pending        INTEGER NOT NULL DEFAULT 0,                 -- its deliveries in state 0, kept by the store
    head           INTEGER NOT NULL DEFAULT 0,                 -- while pending > 0: id of its oldest pending delivery
    created        INTEGER NOT NULL,
    updated        INTEGER NOT NULL,
    deleted        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX hooks_event ON hooks (org, event) WHERE deleted = 0;

-- Notification bodies, one per event and content type (and hook owner), shared by the
-- deliveries of every hook that gets it.
CREATE TABLE payloads (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    body BLOB NOT NULL
);

-- The outbox: written in the transaction of the change that caused it.
CREATE TABLE deliveries (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    hook_id     INTEGER NOT NULL REFERENCES hooks(id),
    event       TEXT NOT NULL,
    object_id   INTEGER NOT NULL,
    contenttype TEXT NOT NULL,
    payload_id  INTEGER NOT NULL REFERENCES payloads(id),
    state       INTEGER NOT NULL DEFAULT 0,                   -- 0 pending, 1 delivered, 2 failed
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER NOT NULL,                             -- Unix seconds of the next attempt
    last_status INTEGER,
    last_error  TEXT NOT NULL DEFAULT '',
    created     INTEGER NOT NULL,
    finished    INTEGER
);
-- Pending deliveries are in no index, so that writing one costs a row and nothing more: a
-- hook's queue is read in id order from its head (hooks.head). Finished ones are indexed per
-- hook (listing), by time (purge), and when failed (counts).
CREATE INDEX deliveries_done ON deliveries (hook_id, id) WHERE state <> 0;
CREATE INDEX deliveries_finished ON deliveries (finished) WHERE state <> 0;
CREATE INDEX deliveries_failed ON deliveries (hook_id) WHERE state = 2;
"#,
    // 3: location: devices (tags) with their current status, location history, zone visits.
    r#"
CREATE TABLE devices (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    org           TEXT NOT NULL REFERENCES organizations(id),
    deviceaddress TEXT NOT NULL,                  -- a/b/c
    deviceid      TEXT NOT NULL,                  -- topic-safe
    label         TEXT NOT NULL DEFAULT '',
    tagtype       INTEGER,                        -- a [[tag_types]] id of the config
    beacon        TEXT NOT NULL,                  -- ibeacon:..., eddystone:..., mac:...
    contact_id    INTEGER REFERENCES items(id),
    created       INTEGER NOT NULL,
    updated       INTEGER NOT NULL,
    -- Status, written by the location engine in batches.
    last_seen_ms  INTEGER,
    battery_mv    INTEGER,
    battery_ms    INTEGER,
    zone_id       INTEGER,                        -- the zone it is in now (NULL: none, away)
    zone_since_ms INTEGER,
    -- The last location update: where it was last seen, in which zone, from which receiver.
    position_zone_id INTEGER,
    lat           REAL,
    lon           REAL,
    receiver      TEXT,
    rssi          REAL,
    position_ms   INTEGER
);
CREATE UNIQUE INDEX devices_address ON devices (deviceaddress);
CREATE UNIQUE INDEX devices_deviceid ON devices (deviceid);
CREATE UNIQUE INDEX devices_beacon ON devices (beacon);
CREATE INDEX devices_contact ON devices (contact_id) WHERE contact_id IS NOT NULL;

-- Bumped on every change of devices' registration (not of their status), so that the engine
-- notices devices added by another process (the command line).
CREATE TABLE devices_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO devices_version (id, version) VALUES (1, 0);
CREATE TRIGGER devices_added AFTER INSERT ON devices BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER devices_removed AFTER DELETE ON devices BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER devices_changed AFTER UPDATE OF deviceaddress, deviceid, label, tagtype, beacon, contact_id, org ON devices BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;

-- Location history: one row per stored update (at zone changes, else at most every
-- [location] update_interval_ms per device). Keyed by device and time: a device's recent
-- history and the purge of old rows both read the key, and no other index is kept.
CREATE TABLE locations (
    device_id INTEGER NOT NULL,
    t_ms      INTEGER NOT NULL,
    zone_id   INTEGER NOT NULL,
    lat       REAL NOT NULL,
    lon       REAL NOT NULL,
    receiver  TEXT NOT NULL,
    rssi      REAL NOT NULL,
    PRIMARY KEY (device_id, t_ms)
) WITHOUT ROWID;

-- Visits: a device in a zone from enter to exit (NULL while it is there).
CREATE TABLE visits (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    device_id INTEGER NOT NULL,
    zone_id   INTEGER NOT NULL,
    enter_ms  INTEGER NOT NULL,
    exit_ms   INTEGER
);
CREATE INDEX visits_device ON visits (device_id, enter_ms);
CREATE INDEX visits_time ON visits (enter_ms);
"#,
    // 4: MQTT credentials, each of one organisation.
    r#"
CREATE TABLE mqtt_users (
    username        TEXT PRIMARY KEY,
    org             TEXT NOT NULL REFERENCES organizations(id),
    receiver        INTEGER NOT NULL DEFAULT 0,            -- may publish to the ingest topics
    password_sha256 BLOB NOT NULL,
    created         INTEGER NOT NULL
);

-- The state each device's feed last published (retained), published again at start.
CREATE TABLE device_states (
    device_id INTEGER PRIMARY KEY REFERENCES devices(id),
    state     TEXT NOT NULL,
    t_ms      INTEGER NOT NULL
);
"#,
    // 5: alerts raised by the rules of config.toml.
    r#"
CREATE TABLE alerts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    org        TEXT NOT NULL REFERENCES organizations(id),
    rule       TEXT NOT NULL,
    type       TEXT NOT NULL,                  -- Monitor, Warn or Alarm
    device_id  INTEGER NOT NULL,
    contact_id INTEGER,
    text       TEXT NOT NULL,
    value      TEXT NOT NULL,
    units      TEXT NOT NULL,
    t_ms       INTEGER NOT NULL,
    ticket_id  INTEGER,                        -- Alarm: the ticket created for it
    acked_ms   INTEGER,
    acked_by   INTEGER
);
CREATE INDEX alerts_org ON alerts (org, id);
"#,
    // 6: the upstream bridge's queue: feed messages waiting for the upstream broker.
    r#"
CREATE TABLE bridge_queue (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    topic   TEXT NOT NULL,
    payload BLOB NOT NULL,
    retain  INTEGER NOT NULL
);
"#,
    // 7: an index of records' field values, for "starts with" searches on one field (lists).
    // A field is indexed from its first such search on (`indexed_fields`), so that writes
    // keep up only the fields people search. `value` is sg_field_key(the value): lower-cased,
    // its first 64 characters. Archived records keep their rows (the lists check `archived`).
    r#"
CREATE TABLE indexed_fields (
    field TEXT PRIMARY KEY
) WITHOUT ROWID;
CREATE TABLE field_values (
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    item  INTEGER NOT NULL REFERENCES items(id),
    PRIMARY KEY (field, value, item)
) WITHOUT ROWID;
"#,
    // 8: bumped on every change of users, groups and memberships (what a verified credential
    // stands for), so that the service's cache of verified credentials outlives the commits
    // that do not touch them and still notices a command-line change (`auth::Verified`).
    r#"
CREATE TABLE credentials_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO credentials_version (id, version) VALUES (1, 0);
CREATE TRIGGER principals_added AFTER INSERT ON principals BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER principals_changed AFTER UPDATE ON principals BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER principals_removed AFTER DELETE ON principals BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER memberships_added AFTER INSERT ON memberships BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER memberships_changed AFTER UPDATE ON memberships BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER memberships_removed AFTER DELETE ON memberships BEGIN
    UPDATE credentials_version SET version = version + 1 WHERE id = 1;
END;
"#,
    // 9: a contact with a device renamed bumps the devices' version too, so that the feed and
    // the alerts name the contact as it is called now (within the engine's devices check),
    // not as it was called up to a minute ago.
    r#"
CREATE TRIGGER device_contacts_renamed AFTER UPDATE OF name ON items
WHEN NEW.typeid = 1 AND NEW.name IS NOT OLD.name AND EXISTS (SELECT 1 FROM devices WHERE contact_id = NEW.id)
BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;
"#,
    // 10: an alert keeps the address and id its device had when it was raised, so that the
    // record still names the tag after the device is deleted or given another address.
    r#"
ALTER TABLE alerts ADD COLUMN deviceaddress TEXT NOT NULL DEFAULT '';
ALTER TABLE alerts ADD COLUMN deviceid TEXT NOT NULL DEFAULT '';
UPDATE alerts SET
    deviceaddress = coalesce((SELECT d.deviceaddress FROM devices d WHERE d.id = alerts.device_id), ''),
    deviceid = coalesce((SELECT d.deviceid FROM devices d WHERE d.id = alerts.device_id), '');
"#,
    // 11: a field's index is filled in steps (`Store::index_field`): `filled_to` is the item
    // id up to which it holds the records there were; NULL once it holds them all.
    r#"
ALTER TABLE indexed_fields ADD COLUMN filled_to INTEGER;
"#,
    // 12: whether an alert went out on the feed: one recorded and not published (the service
    // stopped between the two) is published at the next start. Those before: published.
    r#"
ALTER TABLE alerts ADD COLUMN published INTEGER NOT NULL DEFAULT 1;
"#,
    // 13: what an alert's rule watches (enter, not_seen, battery_low, alarm; '' when its
    // rule was gone), so that acknowledging a device's last open alarm gives its feed state
    // back and lets a new press through. Before: the alert that set a device's alarm state.
    r#"
ALTER TABLE alerts ADD COLUMN channel TEXT NOT NULL DEFAULT '';
UPDATE alerts SET channel = 'alarm' WHERE EXISTS
    (SELECT 1 FROM device_states s WHERE s.device_id = alerts.device_id AND s.state = 'alarm' AND s.t_ms = alerts.t_ms);
CREATE INDEX alerts_open_alarms ON alerts (device_id) WHERE channel = 'alarm' AND acked_ms IS NULL;
"#,
    // 14: when a device's location data was last forgotten (`Store::purge_contact_locations`):
    // what the location thread decided before it, written after it, is not written.
    r#"
ALTER TABLE devices ADD COLUMN purged_ms INTEGER;
"#,
    // 15: whose each visit and history row is: the contact the device was assigned to when it
    // was written (a badge handed on takes no one's past with it). Those before: the device's
    // contact now. A change of a device's contact ends the stay in progress as the old
    // holder's and goes on with it as the new one's, whatever makes the change.
    r#"
ALTER TABLE visits ADD COLUMN contact_id INTEGER;
ALTER TABLE locations ADD COLUMN contact_id INTEGER;
UPDATE visits SET contact_id = (SELECT d.contact_id FROM devices d WHERE d.id = visits.device_id);
UPDATE locations SET contact_id = (SELECT d.contact_id FROM devices d WHERE d.id = locations.device_id);
CREATE INDEX visits_contact ON visits (contact_id) WHERE contact_id IS NOT NULL;
CREATE TRIGGER devices_holder_changed AFTER UPDATE OF contact_id ON devices
WHEN OLD.contact_id IS NOT NEW.contact_id BEGIN
    INSERT INTO visits (device_id, zone_id, enter_ms, exit_ms, contact_id)
        SELECT device_id, zone_id, max(enter_ms, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)), NULL,
               NEW.contact_id
        FROM visits WHERE device_id = NEW.id AND exit_ms IS NULL;
    UPDATE visits SET exit_ms = max(enter_ms, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
        WHERE device_id = NEW.id AND exit_ms IS NULL AND contact_id IS NOT NEW.contact_id;
END;
"#,
    // 16: a contact with a device deleted (archived), restored or erased bumps the devices'
    // version too, as a rename does (9): the feed then says at once that the device has no
    // contact, or has it again. Before, it named the deleted contact for up to a minute.
    r#"
CREATE TRIGGER device_contacts_archived AFTER UPDATE OF archived ON items
WHEN NEW.typeid = 1 AND NEW.archived IS NOT OLD.archived AND EXISTS (SELECT 1 FROM devices WHERE contact_id = NEW.id)
BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER device_contacts_removed AFTER DELETE ON items
WHEN OLD.typeid = 1 AND EXISTS (SELECT 1 FROM devices WHERE contact_id = OLD.id)
BEGIN
    UPDATE devices_version SET version = version + 1 WHERE id = 1;
END;
"#,
    // 17: the alerts in the bridge's queue, which go upstream ahead of the data and state
    // messages queued before them (an alarm raised while a long queue drains waited behind it).
    r#"
CREATE INDEX bridge_queue_alerts ON bridge_queue (id) WHERE topic LIKE '%/alert';
"#,
    // 18: the time each retention purge last purged by (`store::PurgeClock`), so that a wall
    // clock set ahead cannot move the next one far past it: a start with the clock a month
    // ahead deleted every row of history, alerts and deliveries at once.
    r#"
CREATE TABLE purge_clocks (name TEXT PRIMARY KEY, now_ms INTEGER NOT NULL) WITHOUT ROWID;
"#,
    // 19: the newest `updated` of any record or activity, which a change's `updated` never
    // goes below (`records::updated_stamp`): after the clock was set back, records created
    // or first changed were dated before the newest, and clients syncing with `updatedafter`
    // from that newest one missed them.
    r#"
CREATE TABLE updated_high (id INTEGER PRIMARY KEY CHECK (id = 1), v INTEGER NOT NULL);
INSERT INTO updated_high (id, v) SELECT 1, coalesce(max(updated), 0) FROM items;
CREATE TRIGGER updated_high_insert AFTER INSERT ON items
WHEN NEW.updated > (SELECT v FROM updated_high WHERE id = 1) BEGIN
    UPDATE updated_high SET v = NEW.updated WHERE id = 1;
END;
CREATE TRIGGER updated_high_update AFTER UPDATE OF updated ON items
WHEN NEW.updated > (SELECT v FROM updated_high WHERE id = 1) BEGIN
    UPDATE updated_high SET v = NEW.updated WHERE id = 1;
END;
"#,
    // 20: the purge clocks of a database of an earlier version start from the newest time of
    // the data each purges (without one, the first start with the clock ahead purged by it);
    // and a database that took an early form of 18 gets the table 18 makes now.
    r#"
CREATE TABLE IF NOT EXISTS purge_clocks (name TEXT PRIMARY KEY, now_ms INTEGER NOT NULL) WITHOUT ROWID;
DROP TABLE IF EXISTS purge_marks;
INSERT OR IGNORE INTO purge_clocks (name, now_ms)
    SELECT 'location', t FROM (SELECT max(t) AS t FROM
        (SELECT (SELECT max(t_ms) FROM locations l WHERE l.device_id = d.id) AS t FROM devices d
         UNION ALL SELECT max(t_ms) FROM alerts))
    WHERE t IS NOT NULL;
INSERT OR IGNORE INTO purge_clocks (name, now_ms)
    SELECT 'webhook deliveries', t * 1000 FROM (SELECT max(finished) AS t FROM deliveries WHERE state <> 0)
    WHERE t IS NOT NULL;
"#,
];
