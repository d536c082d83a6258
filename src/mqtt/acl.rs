//! Who may subscribe and publish where: pure rules over topic strings, one organisation per
//! client. The broker adapter asks these for every SUBSCRIBE, PUBLISH and will message.
//!
//! - Everything of an organisation is under `{org}/`; nobody sees or writes another's.
//! - The feed topics `{org}/{deviceId}/data|state|alert` are written by the gateway only:
//!   a client cannot forge a location or an alert.
//! - Receiver credentials alone may publish adverts: `{org}/receivers/{receiverId}/adverts`
//!   and ESPresense's `espresense/devices/{id}/{room}` (attributed to the receiver's
//!   organisation).
//! - Filters must name the organisation literally: `+/...`, `#` and `$...` are refused.

/// The authenticated identity of an MQTT client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub org: String,
    /// A remote BLE receiver: may publish to the ingest topics.
    pub receiver: bool,
    /// Test and interoperability setups only (`[mqtt] open_topics`): no topic limits.
    pub unrestricted: bool,
}

pub const FEED_STREAMS: [&str; 3] = ["data", "state", "alert"];

/// A subscription filter this client may hold.
pub fn may_subscribe(p: &Principal, filter: &str) -> bool {
    if p.unrestricted {
        return true;
    }
    // A shared subscription `$share/{group}/{filter}` is judged by its filter.
    let filter = match filter.strip_prefix("$share/").and_then(|rest| rest.split_once('/')) {
        Some((group, inner)) if !group.is_empty() && !group.contains(['+', '#']) => inner,
        _ => filter,
    };
    let mut levels = filter.split('/');
    levels.next() == Some(p.org.as_str()) && levels.next().is_some()
}

/// A topic this client may publish to (also its will topic).
pub fn may_publish(p: &Principal, topic: &str) -> bool {
    if p.unrestricted {
        return true;
    }
    if topic.contains(['+', '#']) {
        return false;
    }
    if is_espresense(topic) {
        return p.receiver;
    }
    // Judged level by level as the topic is split (every PUBLISH comes through here).
    let mut levels = topic.split('/');
    let (Some(org), Some(second)) = (levels.next(), levels.next()) else { return false };
    if org != p.org || second.is_empty() {
        return false;
    }
    if second == "receivers" {
        return p.receiver;
    }
    // {org}/{deviceId}/{data|state|alert}: the gateway's own.
    let feed = levels.next().is_some_and(|third| FEED_STREAMS.contains(&third));
    !(feed && levels.next().is_none())
}

/// `{org}/{deviceId}/{data|state|alert}`: a topic of the gateway's own feed (clients may not
/// publish on one).
pub fn is_feed_topic(topic: &str) -> bool {
    let mut levels = topic.split('/');
    matches!(
        (levels.next(), levels.next(), levels.next(), levels.next()),
        (Some(org), Some(device), Some(stream), None)
            if !org.is_empty() && !device.is_empty() && FEED_STREAMS.contains(&stream)
    )
}

/// `espresense/devices/{id}/{room}`: what ESPresense nodes publish.
pub fn is_espresense(topic: &str) -> bool {
    topic.starts_with("espresense/")
}

/// A topic remote receivers publish adverts on (`{org}/receivers/...` or ESPresense's).
pub fn is_ingest(topic: &str) -> bool {
    is_espresense(topic) || topic.split('/').nth(1) == Some("receivers")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(org: &str) -> Principal {
        Principal { org: org.into(), receiver: false, unrestricted: false }
    }

    #[test]
    fn subscriptions_stay_in_the_organisation() {
        let p = user("acme");
        for ok in ["acme/+/data", "acme/#", "acme/5.1.22/state", "acme/+/+"] {
            assert!(may_subscribe(&p, ok), "{ok}");
        }
        assert!(may_subscribe(&p, "$share/alarms/acme/+/alert"));
        for no in
            ["#", "+/+/data", "other/+/data", "acmex/#", "acme", "$SYS/#", "$share/g/other/#", "$share//acme/#", "+/#"]
        {
            assert!(!may_subscribe(&p, no), "{no}");
        }
    }

    #[test]
    fn publishing_keeps_off_the_feed_and_the_ingest() {
        let p = user("acme");
        assert!(may_publish(&p, "acme/intercom/1/ack"));
        assert!(may_publish(&p, "acme/notes"));
        // Only the three-level feed topics are the gateway's own.
        assert!(may_publish(&p, "acme/5.1.22/data/extra") && may_publish(&p, "acme/5.1.22/datum"));
        for no in [
            "acme/5.1.22/data",
            "acme/5.1.22/alert",
            "acme/x/state",
            "other/notes",
            "acme",
            "acme/",
            "acme/receivers/r1/adverts",
            "espresense/devices/x/lobby",
            "acme/+/x",
        ] {
            assert!(!may_publish(&p, no), "{no}");
        }
        let r = Principal { receiver: true, ..user("acme") };
        assert!(may_publish(&r, "acme/receivers/r1/adverts"));
        assert!(may_publish(&r, "espresense/devices/iBeacon:x-1-2/lobby"));
        assert!(!may_publish(&r, "other/receivers/r1/adverts"));
        assert!(!may_publish(&r, "acme/5.1.22/data"));
        assert!(is_ingest("acme/receivers/r1/adverts") && is_ingest("espresense/devices/x/lobby"));
        assert!(!is_ingest("acme/5.1.22/data") && !is_ingest("acme"));
        let open = Principal { unrestricted: true, ..user("acme") };
        assert!(may_publish(&open, "test/anything") && may_subscribe(&open, "#"));
    }
}
