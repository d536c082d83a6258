//! Every limit the service enforces, in one place, with units in the names.
//!
//! Limits an operator may tune have a `*_DEFAULT` here and a key in config.toml; the
//! `*_CEILING` / `*_FLOOR` constants bound what the configuration may ask for. Limits without
//! a config key are fixed by design.

// --- HTTP --------------------------------------------------------------------------------

/// Largest request body accepted (`[http] body_bytes_max`); larger bodies get 413.
pub const HTTP_BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
pub const HTTP_BODY_BYTES_MAX_CEILING: usize = 64 * 1024 * 1024;

/// Threads that run API handlers (`[http] workers`). A write holds its worker until its
/// batch is committed, so the workers bound how many writes share one commit (BENCHMARKS.md:
/// creates at 32 connections 3.8k/s with 4, 7.4k/s with 16, 7.5k/s with 32).
pub const HTTP_WORKERS_DEFAULT: usize = 16;
pub const HTTP_WORKERS_CEILING: usize = 64;

/// Of the workers, how many take requests whose cost grows with the data (lists, searches,
/// reports, exports, batches; `[http] heavy_workers`); the others take only requests of one
/// item, so those are not queued behind expensive ones. More than the cores adds no speed to
/// expensive requests, and each may hold up to `REPLY_DATA_BYTES_MAX` of answer.
pub const HTTP_HEAVY_WORKERS_DEFAULT: usize = 4;

/// Largest multipart/form-data body (a file upload) (`[http] upload_bytes_max`).
pub const HTTP_UPLOAD_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
pub const HTTP_UPLOAD_BYTES_MAX_CEILING: usize = 256 * 1024 * 1024;

/// Largest `POST /batch` body (`[http] batch_bytes_max`).
pub const HTTP_BATCH_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;
pub const HTTP_BATCH_BYTES_MAX_CEILING: usize = 256 * 1024 * 1024;
/// Nested requests in one batch; more and the whole batch is refused.
pub const BATCH_PARTS_MAX: usize = 100;
/// Headers of one part, and of the nested request in it.
pub const BATCH_PART_HEADERS_MAX: usize = 64;
/// Bytes of the batch reply; a nested answer that would go beyond it is replaced by an error.
pub const BATCH_REPLY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// How long one request's reads may run (a list filtered over every record, a batch of many
/// such parts) before they stop with 503 `serverbusy` (`[http] read_time_max_ms`); they stop
/// too once its client has gone. A worker is not held for minutes by one request, nor by one
/// nobody waits for any more.
pub const HTTP_READ_TIME_MAX_MS_DEFAULT: u64 = 30_000;
/// While the database opens at `serve` (migrations and their backup), systemd is asked every
/// so often for more start time than the unit's `TimeoutStartSec`, up to a bound.
pub const SYSTEMD_START_EXTEND_EVERY_MS: u64 = 20_000;
pub const SYSTEMD_START_EXTEND_BY_MS: u64 = 60_000;
pub const SYSTEMD_START_EXTEND_MAX_MS: u64 = 6 * 60 * 60 * 1000;

/// A certificate the service presents or trusts is warned of this many days before it
/// expires, and looked at again this often.
pub const CERT_EXPIRY_WARN_DAYS: i64 = 30;
pub const CERT_CHECK_INTERVAL_S: u64 = 3_600;

/// At start, alerts recorded and not published (the service stopped between the two) are
/// published if they are at most this old, at most this many.
pub const ALERT_REPUBLISH_WINDOW_MS: i64 = 10 * 60 * 1000;
pub const ALERT_REPUBLISH_MAX: u32 = 200;
/// ... that long after the start, for subscribers to connect again first.
pub const ALERT_REPUBLISH_DELAY_MS: u64 = 5_000;

/// Mistakes of a device list's lines named at once (`sitegate device import`).
pub const DEVICE_IMPORT_ERRORS_SHOWN_MAX: usize = 50;
/// The largest device list `sitegate device import` reads (some 150 bytes a device: room for
/// `LOCATION_DEVICES_MAX` devices with long labels).
pub const DEVICE_IMPORT_BYTES_MAX: u64 = 64 << 20;

/// Items a field's index is filled with in one write, when a "starts with" search on the
/// field is first made (other writes go between two such writes; 5,000 contacts: about 80 ms).
pub const STORE_FIELD_INDEX_FILL_ITEMS: i64 = 5_000;
/// The pause between two such writes, for the writes waiting to take the writer.
pub const STORE_FIELD_INDEX_FILL_PAUSE_MS: u64 = 2;
/// Steps of an SQLite statement between two looks at whether its request's reads should stop.
pub const STORE_PROGRESS_OPS: i32 = 10_000;
/// A worker that read or answered more than this many bytes for one request gives the memory
/// it freed back to the system once it has been idle for `WORKER_RELEASE_IDLE_MS` (the
/// allocator otherwise keeps it for that worker: a burst of large answers left 140 MB held).
pub const WORKER_RELEASE_AFTER_BYTES: usize = 1024 * 1024;
pub const WORKER_RELEASE_IDLE_MS: u64 = 1_000;
/// Bytes of records' and activities' fields one answer may read (a list, a report, a show;
/// in a batch, no more than its reply has room for): beyond it the answer is 413
/// `replytoolarge` and nothing more is read. Rows are charged all their stored fields, also
/// those a list leaves out: 5,000 contacts of 13 KB each fit, a record with a thousand notes
/// of 60 KB does not. The answer is at most about as large again.
pub const REPLY_DATA_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A body over `body_bytes_max` is still read and discarded up to this many bytes before the
/// 413 goes out, so the client sees the answer instead of a reset connection.
pub const HTTP_DRAIN_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Requests whose body may exceed `[http] body_bytes_max` (file uploads, batches) served at
/// once; more are answered 503 `busy`. Bounds what their bodies hold: this x
/// `upload_bytes_max`.
pub const HTTP_LARGE_BODIES_MAX: usize = 4;
/// ... of which one client address holds at most this many (they are taken before the
/// credentials are checked: one host cannot hold them all).
pub const HTTP_LARGE_BODIES_PER_ADDRESS_MAX: usize = 2;

/// Requests waiting for a worker (`[http] queue_depth_max`); beyond it the answer is 503.
pub const HTTP_QUEUE_DEPTH_MAX_DEFAULT: usize = 256;
pub const HTTP_QUEUE_DEPTH_MAX_CEILING: usize = 65_536;

/// Open client connections per listener (`[http] connections_max`); further clients wait in
/// the kernel's accept backlog until a connection closes.
pub const HTTP_CONNECTIONS_MAX_DEFAULT: usize = 1024;
pub const HTTP_CONNECTIONS_MAX_CEILING: usize = 100_000;
/// Open connections from one client address, IPv6 by /64 (`[http]
/// connections_per_address_max`; at most `connections_max`): beyond it a new connection is
/// closed at once, so one client cannot take every slot.
pub const HTTP_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 256;

/// Time a client has to send a request's headers, and the longest a kept-alive connection
/// may sit idle between requests (`[http] header_read_timeout_ms`).
pub const HTTP_HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Time a client has to send a whole request body (`[http] body_read_timeout_ms`).
pub const HTTP_BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Time an answer may wait for the client to take any more of it (`[http] send_timeout_ms`);
/// then the connection is closed, so that a client that asks and does not read cannot hold
/// its answer's memory and its connection for good.
pub const HTTP_SEND_TIMEOUT_MS_DEFAULT: u64 = 60_000;
pub const HTTP_TIMEOUT_MS_FLOOR: u64 = 100;
pub const HTTP_TIMEOUT_MS_CEILING: u64 = 3_600_000;

/// Bytes buffered for a request line plus headers; more gets 431 and a closed connection.
/// hyper refuses buffers below 8192 bytes.
pub const HTTP_HEAD_BYTES_MAX: usize = 16 * 1024;
const _: () = assert!(HTTP_HEAD_BYTES_MAX >= 8192);

/// How long shutdown waits for requests in flight before closing their connections.
pub const HTTP_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// At shutdown, how long webhook senders may take to finish the delivery they are sending (a
/// slow receiver); then they are left, and what they sent goes again after the restart.
pub const WEBHOOK_SHUTDOWN_WAIT_MS: u64 = 5_000;

// --- Runtime -------------------------------------------------------------------------------

/// File descriptors kept for what is not a client connection (the database, logs, webhook
/// and upstream connections, BlueZ): the open-files limit must cover this and every
/// connection `connections_max` allows.
pub const PROCESS_FILES_RESERVED: usize = 256;

/// A system clock before this time (2025-01-01, Unix seconds) has not been set: a gateway
/// without a battery-backed clock before NTP reached it. `serve` warns; `cert` refuses (its
/// certificates would not be valid once the clock is set).
pub const CLOCK_PLAUSIBLE_FROM_UNIX_S: i64 = 1_735_689_600;

/// Async runtime threads (connections, TLS, timers).
pub const RUNTIME_WORKER_THREADS: usize = 2;
/// Threads for blocking work on the runtime (the watchdog's database probe).
pub const RUNTIME_BLOCKING_THREADS_MAX: usize = 8;

// --- Request input -------------------------------------------------------------------------

/// Nesting depth of an XML, JSON or form body.
pub const INPUT_DEPTH_MAX: usize = 32;
/// Elements (XML) or values (JSON, form) in one body.
pub const INPUT_NODES_MAX: usize = 20_000;
/// Bytes of one field value.
pub const FIELD_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Bytes of a short name (category tag, user or group name).
pub const NAME_BYTES_MAX: usize = 255;
/// Files in one request body (a file activity takes one).
pub const UPLOADS_PER_REQUEST_MAX: usize = 8;
/// Category tags or related items added or removed in one request.
pub const REFERENCES_PER_REQUEST_MAX: usize = 1_000;
/// Bytes of a list `searchvalue` or `filtervalue`.
pub const SEARCH_VALUE_BYTES_MAX: usize = 1_024;
/// Characters kept of a JSONP `callback` name.
pub const JSONP_CALLBACK_CHARS_MAX: usize = 128;
/// The largest id a path names (18 digits); a larger or negative one names no item (404).
pub const PATH_ID_MAX: i64 = 999_999_999_999_999_999;

// --- Records -------------------------------------------------------------------------------

/// Records per page of a list (`limit`): default and maximum, as the interface specifies.
pub const LIST_LIMIT_DEFAULT: u32 = 50;
pub const LIST_LIMIT_MAX: u32 = 5_000;
/// Default window of the day-based list filters (`viewed`, `created`, `updated`, ...).
pub const LIST_FILTER_DAYS_DEFAULT: u32 = 30;
/// Default window of `duesoon`.
pub const LIST_DUESOON_DAYS_DEFAULT: u32 = 7;
/// Largest day window a list filter accepts.
pub const LIST_FILTER_DAYS_MAX: u32 = 36_600;
/// Fewest digits a `byphone` filter value must carry.
pub const LIST_BYPHONE_DIGITS_MIN: usize = 3;

/// Activities per report answer (`limit`): default and maximum.
pub const REPORT_ROWS_DEFAULT: u32 = 500;
pub const REPORT_ROWS_MAX: u32 = 5_000;

// --- Webhooks ------------------------------------------------------------------------------

/// Delays before the retries of a failed delivery (`[webhooks] retry_delays_s`): four retries.
pub const WEBHOOK_RETRY_DELAYS_S_DEFAULT: [u64; 4] = [60, 300, 1800, 7200];
pub const WEBHOOK_RETRIES_MAX: usize = 10;
pub const WEBHOOK_RETRY_DELAY_S_MAX: u64 = 7 * 86_400;
/// Connecting to a receiver (`[webhooks] connect_timeout_ms`) and the whole exchange
/// (`[webhooks] timeout_ms`).
pub const WEBHOOK_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
pub const WEBHOOK_TIMEOUT_MS_DEFAULT: u64 = 15_000;
/// Deliveries sent at once, each to a different hook (`[webhooks] workers`).
pub const WEBHOOK_WORKERS_DEFAULT: usize = 4;
pub const WEBHOOK_WORKERS_CEILING: usize = 64;
/// Pending deliveries of one hook above which it is paused (`[webhooks] backlog_max`).
pub const WEBHOOK_BACKLOG_MAX_DEFAULT: u64 = 10_000;
pub const WEBHOOK_BACKLOG_MAX_CEILING: u64 = 10_000_000;
/// Days delivered and failed deliveries are kept (`[webhooks] retention_days`).
pub const WEBHOOK_RETENTION_DAYS_DEFAULT: u64 = 7;
pub const WEBHOOK_RETENTION_DAYS_CEILING: u64 = 3_650;
/// Webhooks one organisation may have (active or not): every write reads its active ones, and
/// each matching hook queues a delivery. Another create answers 409 `limitreached`.
pub const WEBHOOKS_PER_ORG_MAX: i64 = 100;
/// Largest delivery body.
pub const WEBHOOK_BODY_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of a receiver's answer read (and kept as the error of a failed attempt).
pub const WEBHOOK_RESPONSE_BYTES_MAX: u64 = 64 * 1024;
pub const WEBHOOK_ERROR_CHARS_MAX: usize = 500;
/// A hook whose batch takes longer than this (or fails) counts as slow: slow hooks share half
/// the senders.
pub const WEBHOOK_SLOW_BATCH_MS: u64 = 2_000;
/// Nice value of the sending threads (0 normal, 19 lowest): they give way to the API.
pub const WEBHOOK_SENDER_NICE: i32 = 10;
/// Kept-alive connections to receivers, all senders together.
pub const WEBHOOK_IDLE_CONNECTIONS_MAX: usize = 64;
/// Deliveries of one hook a sender takes at once (sent in order).
pub const WEBHOOK_BATCH_PER_HOOK: u32 = 32;
/// A sender records what it sent of a batch at least this often (a crash repeats at most
/// what was sent since, and the delivery in flight).
pub const WEBHOOK_RECORD_INTERVAL_MS: u64 = 250;
/// Least time between two reads of the outbox when new deliveries keep arriving.
pub const WEBHOOK_READ_SPACING_MS: u64 = 5;
/// How often the delivery worker looks for due deliveries when nothing wakes it.
pub const WEBHOOK_POLL_INTERVAL_MS: u64 = 1_000;
/// Receivers remembered as slow or failing (see `webhooks::Senders`).
pub const WEBHOOK_SLOW_RECEIVERS_MAX: usize = 1_024;
/// How often delivered and failed deliveries past the retention are purged.
pub const WEBHOOK_PURGE_INTERVAL_S: u64 = 3_600;
/// Deliveries (and payloads) purged per write transaction.
pub const WEBHOOK_PURGE_ROWS_MAX: u32 = 2_000;
/// Deliveries listed by `/hooks/{id}/deliveries` at most.
pub const WEBHOOK_DELIVERIES_LISTED_MAX: u32 = 1_000;
/// Bytes of a hook's url, title or secret.
pub const WEBHOOK_TEXT_BYTES_MAX: usize = 2_048;

// --- Quota ---------------------------------------------------------------------------------

/// API calls per user per clock hour (`[api] quota_calls_per_hour`).
pub const QUOTA_CALLS_PER_HOUR_DEFAULT: u32 = 10_000;
pub const QUOTA_CALLS_PER_HOUR_CEILING: u32 = 100_000_000;
/// How often the in-memory quota counters are written to the database.
pub const QUOTA_FLUSH_INTERVAL_MS: u64 = 30_000;

/// The buffer a response document is rendered into, to start with (it grows as needed).
pub const RENDER_BUFFER_BYTES: usize = 4 * 1024;

// --- Store ---------------------------------------------------------------------------------

/// How long a write waits for another process (a CLI command) holding the write lock.
pub const STORE_BUSY_TIMEOUT_MS: u64 = 5_000;
/// Group commit: writes that arrive while others run join one transaction, committed (one
/// fsync) when no further write waits, or when the batch holds this many writes...
pub const STORE_BATCH_WRITES_MAX: usize = 256;
/// ...or has been open this long (a steady stream of writes still commits).
pub const STORE_BATCH_OPEN_MS_MAX: u64 = 20;
/// Bytes of write-ahead log kept once it has been checkpointed (`journal_size_limit`): a
/// larger log is cut back to this size.
pub const STORE_WAL_BYTES_KEPT_MAX: u64 = 8 * 1024 * 1024;
/// `restore` keeps the database it replaces as `<database>.before-restore-<time>`, then `-2`,
/// `-3`, ... for restores within the same second, up to this many names.
pub const KEPT_DATABASE_NAMES_MAX: usize = 100;
/// Idle read connections kept open for reuse.
pub const STORE_READERS_IDLE_MAX: usize = 16;
/// Items with a "viewed" stamp waiting to be written; when full, stamps of further items are
/// dropped (and counted).
pub const STORE_VIEWED_QUEUE_DEPTH_MAX: usize = 8_192;
/// How often queued "viewed" stamps are written, in one transaction.
pub const STORE_VIEWED_FLUSH_INTERVAL_MS: u64 = 1_000;
/// Free space on the database's file system below which `/health` says `low` and the log warns
/// (checked every `STORE_VIEWED_FLUSH_INTERVAL_MS`): room for about a day of a busy site's writes.
pub const DISK_FREE_LOW_BYTES: u64 = 64 * 1024 * 1024;

// --- Users ---------------------------------------------------------------------------------

/// Verified credentials remembered until users, groups or memberships next change (emptied
/// when full).
pub const AUTH_VERIFIED_ENTRIES_MAX: usize = 1_024;
/// How often the verified credentials are checked against other processes' changes of users
/// (a CLI command replacing a token or disabling a user), at most: such a change applies to
/// requests from this long after it. The service's own changes apply to the next request.
pub const AUTH_OTHER_PROCESS_CHECK_MS: u64 = 1;

/// Failed logins from one client address (IPv6: one /64) that lock it out
/// (`[api] login_failures_max`), and for how long (`[api] login_lockout_s`; failures further
/// apart than this do not add up).
pub const AUTH_LOGIN_FAILURES_MAX_DEFAULT: u32 = 10;
pub const AUTH_LOGIN_FAILURES_MAX_CEILING: u32 = 1_000_000;
pub const AUTH_LOGIN_LOCKOUT_S_DEFAULT: u64 = 300;
pub const AUTH_LOGIN_LOCKOUT_S_CEILING: u64 = 86_400;
/// Client addresses whose failed logins are remembered (beyond, the oldest is forgotten).
pub const AUTH_THROTTLE_ADDRESSES_MAX: usize = 10_000;

/// Random bytes in an API token (256 bits).
pub const TOKEN_BYTES: usize = 32;

/// Location: defaults of `[location]` (see config.toml for their meaning).
pub const LOCATION_WINDOW_MS_DEFAULT: u64 = 8_000;
pub const LOCATION_SMOOTHING_MS_DEFAULT: u64 = 1_500;
pub const LOCATION_STALE_MS_DEFAULT: u64 = 10_000;
pub const LOCATION_HYSTERESIS_DB_DEFAULT: f64 = 6.0;
pub const LOCATION_DWELL_DB_S_DEFAULT: f64 = 8.0;
pub const LOCATION_AWAY_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const LOCATION_UPDATE_INTERVAL_MS_DEFAULT: u64 = 60_000;
pub const LOCATION_RETENTION_DAYS_DEFAULT: u64 = 30;
/// Receivers in the site map.
pub const LOCATION_RECEIVERS_MAX: usize = 1_000;
/// Ids of areas, buildings, floors, zones and tag types: 1 to this.
pub const LOCATION_ID_MAX: i64 = 2_147_483_647;
/// Devices the engine tracks at once.
pub const LOCATION_DEVICES_MAX: usize = 100_000;
/// Readings kept per device and receiver (within the window).
pub const LOCATION_READINGS_PER_LINK_MAX: usize = 64;
/// Zones one zone may list as `adjacent` in the site map.
pub const LOCATION_ADJACENT_ZONES_MAX: usize = 64;
/// The most zones a site map may hold (the engine keeps a little evidence per device and zone).
pub const LOCATION_ZONES_MAX: usize = 1_000;
/// Fingerprints of one zone in the site map (`sitegate survey` writes one per
/// `SURVEY_FINGERPRINT_S` of a zone's survey).
pub const LOCATION_FINGERPRINTS_PER_ZONE_MAX: usize = 64;
/// `sitegate survey`: seconds of a zone's samples that make one fingerprint.
pub const SURVEY_FINGERPRINT_S: u32 = 20;
/// `sitegate survey`: marks in a marks file, and seconds sampled in all.
pub const SURVEY_MARKS_MAX: usize = 10_000;
pub const SURVEY_SAMPLES_MAX: usize = 1_000_000;
/// `sitegate survey`: a receiver belongs to a zone's fingerprint when it heard the survey tag
/// in at least this share of the zone's samples.
pub const SURVEY_HEARD_SHARE_MIN: f64 = 0.5;
/// Longest line of an advert trace.
pub const TRACE_LINE_BYTES_MAX: usize = 64 * 1024;
/// Receiver names a trace reader shares between adverts (beyond, each advert has its own).
pub const TRACE_RECEIVERS_MAX: usize = 4_096;
/// Adverts waiting for the engine (live sources); beyond, they are dropped and counted.
pub const LOCATION_ADVERT_QUEUE_MAX: usize = 10_000;
/// Adverts with a raised alarm flag waiting beside a full advert queue (read first); beyond,
/// they are dropped and counted too.
pub const LOCATION_URGENT_QUEUE_MAX: usize = 1_000;
/// The start waits at most this long for the location engine to load (devices, placements,
/// the states it publishes) before it serves anyway.
pub const LOCATION_START_WAIT_MS: u64 = 60_000;
/// BLE: pause before scanning again after a round that failed (BlueZ or the adapter missing),
/// doubling for each such round in a row up to the max; after one that heard adverts, the
/// min. A round that scanned and heard nothing (a quiet site) is followed at once.
pub const BLE_RETRY_MIN_MS: u64 = 1_000;
pub const BLE_RETRY_MAX_MS: u64 = 30_000;
/// BLE: how long an RSSI event waits for the data events of the same advertisement.
pub const BLE_JOIN_WAIT_MS: u64 = 20;
/// BLE: the longest wait for BlueZ to list its adapters, to stop scanning or to say whether
/// the adapter is powered (a connection the bus dropped, or a hung bluetoothd, answers
/// nothing for 25 s).
pub const BLE_CALL_TIMEOUT_MS: u64 = 3_000;
/// BLE: devices whose advertising data is remembered (phones rotate addresses).
pub const BLE_KNOWN_DEVICES_MAX: usize = 10_000;
/// Location: the engine's decisions are written at most this often (one transaction), each
/// time after looking whether devices were added, changed or deleted.
pub const LOCATION_FLUSH_MS: u64 = 1_000;
/// The wall clock moving this much more or less than the monotonic clock between two looks
/// (at most a quarter of `LOCATION_FLUSH_MS` apart) is a step (NTP setting the clock), and
/// the location engine's and the alerts' times move with it.
pub const LOCATION_CLOCK_STEP_MS_MIN: i64 = 1_000;
/// Location: history past the retention is purged this often, in batches of rows.
pub const LOCATION_PURGE_INTERVAL_S: u64 = 3_600;
/// The time a retention purge purges by (now, less the retention for the cut-off) moves
/// ahead of the last one stored by at most this much at a start, and from one purge to the
/// next at most this many times as fast as the monotonic clock runs: a wall clock set wrongly
/// ahead (by days, years) costs the oldest hour of the data and then a day of it per hour,
/// instead of all of it at once, while a gateway that was off for a month is back within its
/// retention in a day and a half.
pub const PURGE_CLOCK_LEAD_MS: i64 = 3_600_000;
pub const PURGE_CLOCK_CATCH_UP_RATE: i64 = 24;
pub const LOCATION_PURGE_ROWS_MAX: u32 = 5_000;
/// Location: decisions held for one write at most (beyond, the newest are dropped and logged).
pub const LOCATION_BATCH_EVENTS_MAX: usize = 100_000;
/// Location API: rows of history in a `/locate` answer (`historyminutes`).
pub const LOCATE_HISTORY_ROWS_MAX: u32 = 10_000;
/// Location API: `lastreportedwithin` and `historyminutes` at most (a week).
pub const LOCATION_MINUTES_MAX: i64 = 7 * 24 * 60;
/// Time-in-zone reports: the range without `range`, the longest range, rows per page, and
/// visits read for one report.
pub const LOCATION_REPORT_DEFAULT_DAYS: i64 = 1;
pub const LOCATION_REPORT_RANGE_DAYS_MAX: i64 = 366;
pub const LOCATION_REPORT_PAGE_ROWS: usize = 500;
pub const LOCATION_REPORT_VISITS_MAX: u32 = 200_000;
/// Location history rows of one device in a contact's export (30 days at one a minute: 43,200).
pub const LOCATION_EXPORT_ROWS_MAX: u32 = 1_000_000;

// --- MQTT --------------------------------------------------------------------------------

/// Open MQTT connections (`[mqtt] connections_max`); more are refused at accept.
pub const MQTT_CONNECTIONS_MAX_DEFAULT: usize = 1_000;
pub const MQTT_CONNECTIONS_MAX_CEILING: usize = 100_000;

/// Largest MQTT packet a client may send (`[mqtt] packet_bytes_max`).
pub const MQTT_PACKET_BYTES_MAX_DEFAULT: u32 = 256 * 1024;
pub const MQTT_PACKET_BYTES_MAX_CEILING: u32 = 16 * 1024 * 1024;

/// Messages queued for one subscriber that does not keep up (`[mqtt] client_queue_max`);
/// beyond it the oldest are dropped for that subscriber only (counted).
pub const MQTT_CLIENT_QUEUE_MAX_DEFAULT: usize = 1_000;
pub const MQTT_CLIENT_QUEUE_MAX_CEILING: usize = 100_000;

/// QoS 1/2 messages in flight to one client before it acknowledges.
pub const MQTT_INFLIGHT_MAX: u16 = 16;

/// Time from TCP accept to a complete CONNECT (`[mqtt] handshake_timeout_ms`).
pub const MQTT_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const MQTT_HANDSHAKE_TIMEOUT_MS_CEILING: u64 = 120_000;

/// How long a disconnected client's persistent session (and its queue) is kept.
pub const MQTT_SESSION_EXPIRY_S: u64 = 2 * 60 * 60;

/// Subscriptions one client may hold, topic levels a topic may have, client id length.
pub const MQTT_SUBSCRIPTIONS_PER_CLIENT_MAX: usize = 100;
pub const MQTT_TOPIC_LEVELS_MAX: usize = 16;
pub const MQTT_CLIENT_ID_BYTES_MAX: usize = 128;

/// Retained messages the broker keeps of clients' own; a new retained topic beyond it is not
/// kept (logged). The feed's device states are kept besides (one per device, at most
/// `LOCATION_DEVICES_MAX`), whatever clients retained.
pub const MQTT_RETAINED_MAX: usize = 100_000;
/// Bytes of clients' retained messages together, each counted as its payload, four times its topic
/// (the broker keeps the topic in its tree, in the message and in this count) and
/// `MQTT_RETAINED_OVERHEAD_BYTES`; a retained message beyond is not kept.
pub const MQTT_RETAINED_BYTES_MAX: usize = 64 * 1024 * 1024;
pub const MQTT_RETAINED_OVERHEAD_BYTES: usize = 256;
/// Longest topic of a retained message (the feed's are some 40 bytes); a longer one is
/// delivered but not kept.
pub const MQTT_RETAINED_TOPIC_BYTES_MAX: usize = 1024;
/// How often retained messages past their own MQTT 5 expiry are let go.
pub const MQTT_RETAINED_SWEEP_INTERVAL_MS: u64 = 60_000;

/// Feed messages waiting between the engine and the broker; when full the engine does not
/// wait: the message is dropped and counted.
pub const MQTT_FEED_QUEUE_MAX: usize = 10_000;
/// At start every device's stored state is published again, before the broker takes clients
/// (more of them than the queue holds on a large site): a full queue is waited for, at most
/// this long in all.
pub const MQTT_FEED_RESTORE_WAIT_MS: u64 = 30_000;

/// An alert's message waits at most this long for room in a full feed queue; one that found
/// none is published when there is room (the alerts after it wait behind it), not dropped.
pub const MQTT_FEED_ALERT_WAIT_MS: u64 = 2_000;

/// How often the feed reads the devices again (contact names may change).
pub const MQTT_FEED_DEVICES_REFRESH_MS: u64 = 60_000;

/// Length of an MQTT username.
pub const MQTT_USERNAME_CHARS_MAX: usize = 128;

/// Adverts in one message of a remote receiver (`{org}/receivers/{id}/adverts`).
pub const MQTT_INGEST_ADVERTS_PER_MESSAGE_MAX: usize = 1_000;

/// A remote receiver not heard for this long is named in /health (`[location]
/// receiver_silent_s`).
pub const LOCATION_RECEIVER_SILENT_S_DEFAULT: u64 = 300;

// --- Status page -------------------------------------------------------------------------

/// Open alerts the status page shows at most (Alarms first, then Warns, then Monitors).
pub const STATUS_ALERTS_MAX: u32 = 200;
/// A battery below this many millivolts is marked low on the status page.
pub const STATUS_BATTERY_LOW_MV: i64 = 2_500;
/// Status pages open at once (each holds one event stream, not a worker); beyond, 503.
pub const STATUS_STREAMS_MAX: usize = 32;
/// ... of them one user's at most (a page in a few browsers).
pub const STATUS_STREAMS_PER_USER_MAX: usize = 4;
/// How often an event stream looks for a change in the database...
pub const STATUS_EVENTS_CHECK_MS: u64 = 500;
/// ...and sends the snapshot again when it changed anyway (health, uptime, receivers).
pub const STATUS_EVENTS_REFRESH_MS: u64 = 5_000;
/// A comment line keeps a quiet stream (and proxies in front of it) alive.
pub const STATUS_EVENTS_KEEPALIVE_MS: u64 = 15_000;
/// Snapshots waiting to be written to one stream (a slow client holds up only itself).
pub const STATUS_EVENTS_QUEUE_MAX: usize = 2;

// --- Alerts ------------------------------------------------------------------------------

/// `[[alert_rules]]` entries.
pub const ALERT_RULES_MAX: usize = 200;

/// A rule fires at most once per device in this many seconds (`repeat_s`).
pub const ALERT_REPEAT_S_DEFAULT: u64 = 300;
/// A panic button's flag raised again this long after it was last seen raised is a new
/// press, also when the alarm of the one before was acknowledged while it was held down.
pub const ALERT_ALARM_RELEASE_MS: i64 = 15_000;
/// A device's `lowbattery` state ends with a battery report this far above every battery
/// rule's threshold (the readings jitter by tens of millivolts).
pub const ALERT_BATTERY_RECOVERED_MARGIN_MV: i64 = 100;

/// (rule, device) pairs whose last alert time is remembered for the rate limit.
pub const ALERT_STATE_ENTRIES_MAX: usize = 100_000;

/// Alerts `GET /alerts` returns at most.
pub const ALERT_LIST_MAX: u32 = 1_000;

/// Alerts forgotten per purge write (older than `[location] retention_days`).
pub const ALERT_PURGE_ROWS_MAX: u32 = 2_000;
/// Alerts raised (and published) that the database refused (a full disk), kept to be
/// recorded when it takes them again; beyond, the newest are logged and not recorded.
pub const ALERT_UNRECORDED_MAX: usize = 1_000;

/// The upstream bridge: messages queued on disk while upstream is down
/// (`[mqtt] bridge_queue_max`), in flight unacknowledged, and written to the queue per write.
pub const MQTT_BRIDGE_QUEUE_MAX_DEFAULT: u64 = 100_000;
pub const MQTT_BRIDGE_QUEUE_MAX_CEILING: u64 = 10_000_000;
pub const MQTT_BRIDGE_INFLIGHT_MAX: u16 = 100;
pub const MQTT_BRIDGE_BATCH_MAX: usize = 1_000;
/// Upstream connections ending in a row with the same message the oldest unacknowledged, after
/// which that message is dropped (an upstream that refuses it would hold the queue for good).
pub const MQTT_BRIDGE_REFUSALS_MAX: u32 = 5;
/// A bridge connection that lasted this long counts as held: when it ends, reconnecting starts
/// over at 1 s. One shorter keeps the backoff growing (an upstream that takes each connection
/// away at once, such as another client with the same id, is not hammered).
pub const MQTT_BRIDGE_CONNECTION_HELD_MS: u64 = 10_000;

/// A reconnecting client waits up to STEPS x STEP_MS for its old session to finish closing.
/// How often connections to the broker's ports that sent no CONNECT within the handshake
/// timeout are looked for and closed.
pub const MQTT_REAP_INTERVAL_MS: u64 = 2_000;
pub const MQTT_RECONNECT_WAIT_STEPS: u32 = 40;
pub const MQTT_RECONNECT_WAIT_STEP_MS: u64 = 25;

/// MQTT 5 clients are told to keep alive at most this often (seconds).
pub const MQTT_KEEPALIVE_MAX_S: u16 = 60;
