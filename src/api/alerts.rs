//! `GET /alerts` and `POST /alerts/{id}/ack`: the alerts the rules raised for the caller's
//! organisation.

use super::error::ApiError;
use super::input::Params;
use super::output::Out;
use super::{Ctx, Reply};
use crate::limits;
use crate::store::StoredAlert;
use crate::timefmt::{local_ms, now_ms};

/// An alert as the API shows it (also the `alerts.create` webhook's content).
pub fn alert_out(tz: &jiff::tz::TimeZone, a: &StoredAlert) -> Out {
    let opt_int = |v: Option<i64>| v.map_or(Out::Null, Out::Int);
    Out::map()
        .with("id", Out::Int(a.id))
        .with("type", Out::text(a.kind.clone()))
        .with("rule", Out::text(a.rule.clone()))
        .with("channel", Out::text(a.channel.clone()))
        .with("text", Out::text(a.text.clone()))
        .with("deviceaddress", Out::text(a.deviceaddress.clone()))
        .with("deviceid", Out::text(a.deviceid.clone()))
        .with("contactid", opt_int(a.contact_id))
        .with("contactname", a.contact_name.clone().map_or(Out::Null, Out::text))
        .with("value", Out::text(a.value.clone()))
        .with("units", Out::text(a.units.clone()))
        .with("timestamp", Out::text(local_ms(a.t_ms, tz)))
        .with("ticketid", opt_int(a.ticket_id))
        .with("acked", Out::Int(i64::from(a.acked_ms.is_some())))
        .with("ackedat", Out::text(a.acked_ms.map(|t| local_ms(t, tz)).unwrap_or_default()))
        .with("ackedby", opt_int(a.acked_by))
}

/// Open alerts, newest first; `all=1` includes acknowledged ones, `type=Warn` (Monitor,
/// Warn, Alarm) narrows them; `limit` (at most `ALERT_LIST_MAX`) and `before` (an alert id:
/// those older) page through them.
pub fn list(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let params = ctx.params();
    let p = Params::new(&params);
    let all = p.flag("all")?.unwrap_or(false);
    let kind = match p.nonempty("type")? {
        None => None,
        Some(t) => Some(
            crate::alerts::rules::AlertType::parse(&t)
                .ok_or_else(|| ApiError::invalid_parameter("type", "is Monitor, Warn or Alarm"))?
                .as_str(),
        ),
    };
    let max = i64::from(limits::ALERT_LIST_MAX);
    let limit = p.int_within("limit", 1, max, max)? as u32;
    let before = match p.int("before")? {
        Some(n) if n < 1 => return Err(ApiError::invalid_parameter("before", format!("{n} is not an alert id"))),
        b => b,
    };
    let mut alerts =
        ctx.app.store.alerts(&ctx.viewer.org, all, kind, crate::store::AlertOrder::Newest, before, limit)?;
    hide_invisible_contacts(ctx.app, &ctx.viewer, &mut alerts)?;
    let records: Vec<Out> = alerts.iter().map(|a| alert_out(&ctx.app.config.site.timezone, a)).collect();
    let inner = Out::map().with("count", Out::Int(records.len() as i64)).with("records", Out::list("alert", records));
    Ok(Reply::ok(Out::map().with("alerts", inner)))
}

/// Acknowledges an alert; acknowledging it again keeps the first acknowledgement.
pub fn ack(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    let a = ctx.app.store.ack_alert(&ctx.viewer.org, id, ctx.viewer.user_id, now_ms())?;
    let mut one = [a];
    hide_invisible_contacts(ctx.app, &ctx.viewer, &mut one)?;
    let [a] = one;
    Ok(Reply::ok(Out::map().with("alert", alert_out(&ctx.app.config.site.timezone, &a))))
}

/// An alert names its device's contact only to callers who may see that contact record.
pub fn hide_invisible_contacts(
    app: &super::App,
    viewer: &crate::model::Viewer,
    alerts: &mut [StoredAlert],
) -> Result<(), ApiError> {
    if viewer.admin {
        return Ok(());
    }
    let contacts: Vec<i64> = alerts.iter().filter_map(|a| a.contact_id).collect();
    let visible = app.store.visible_ids(viewer, &contacts)?;
    for a in alerts.iter_mut() {
        if a.contact_id.is_some_and(|id| !visible.contains(&id)) {
            a.contact_id = None;
            a.contact_name = None;
        }
    }
    Ok(())
}
