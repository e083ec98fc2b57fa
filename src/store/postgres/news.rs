//! Permit news: one connection of its own per instance listens on
//! `NEWS_CHANNEL`, where an instance says that it waits for slots others
//! hold, that it wants less and gave back slots others want, or that it
//! deactivated another (`pg_notify`, delivered when its statement
//! commits). Instances whose split did not change here can then leave the
//! database alone until they hear something. News is rare on purpose: each one costs every
//! listening session a transaction to read it.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use uuid::Uuid;

use crate::backoff::Backoff;

/// The channel permit news goes out on. The payload is the instance that
/// sent it (its own news is not news to it), or empty for news to all.
pub(super) const NEWS_CHANNEL: &str = "jobcenter_permits";

/// Listens until `news` has no receiver left: while connected and
/// listening the value is `true`, and every notification from another
/// instance marks it changed; a connection lost (or not yet made) sets it
/// `false`, and a new one `true` again, which is news in itself, since
/// whatever was said meanwhile was not heard.
pub(super) async fn listen(
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    me: Uuid,
    news: watch::Sender<bool>,
) {
    let me = me.to_string();
    let mut again = Backoff::doubling(Duration::from_millis(100), Duration::from_secs(5));
    while !news.is_closed() {
        match listen_once(&config, &tls, &me, &news).await {
            Ok(()) => tracing::debug!("the permit news connection ended"),
            Err(e) => tracing::debug!(error = %e, "the permit news connection failed"),
        }
        news.send_if_modified(|listening| std::mem::replace(listening, false));
        tokio::select! {
            () = tokio::time::sleep(again.next_pause()) => {}
            () = news.closed() => return,
        }
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    tls: &tokio_postgres_rustls::MakeRustlsConnect,
    me: &str,
    news: &watch::Sender<bool>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    // The connection delivers the notifications; it is driven here, beside
    // the one command this client sends.
    let mut messages = std::pin::pin!(async {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(note))) if note.payload() != me => news.send_modify(|_| {}),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    let listen = format!("LISTEN {NEWS_CHANNEL}");
    tokio::select! {
        ended = &mut messages => return ended,
        listening = client.batch_execute(&listen) => listening?,
    }
    news.send_replace(true);
    tokio::select! {
        ended = messages => ended,
        () = news.closed() => Ok(()),
    }
}
