//! Handover on a rolling restart (cluster mode): a host that leaves (SIGTERM) stops taking calls from its
//! peers, lets each of its calls that can move go at a handler boundary, and offers each to the hosts
//! taking calls (a NATS queue group: one of them gets it). The peer that takes an offer claims the call's
//! token (a KV `create`, so nobody else resumes it), adopts it into the same agent, resumes it on its own
//! connection with a fresh instance of the same version, and answers once Sent has resumed it. A call no
//! peer took in time is claimed back by the leaving host and resumed on its own connection, on its own
//! version and in the room it held, and offered again a little later, until the leave's time is up; what
//! remains then goes as `serve` always let it: its connection closes with 1000 and Sent sends it to the
//! fallback.
//!
//! Sent spends a token once: should both hosts resume a call (a peer slow past the offer's timeout), one
//! of them is refused and loses its copy; the call is served once.

use super::{Running, Tenancy};
use crate::agent::{Arrival, Departure, Moves, MovingCall};
use crate::tenancy::cluster::{Claim, NatsStore, OfferError, Offered};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a peer waits for Sent to resume a call it took (less than the leaving host's offer timeout,
/// so it answers before the leaving host gives up on it).
const RESUME_WITHIN: Duration = Duration::from_secs(6);
/// How long a call the leaving host took back stays before it is offered again.
const OFFER_AGAIN_AFTER: Duration = Duration::from_secs(1);
/// How long a call that can never be offered (larger than NATS carries) stays: past any leave.
const NEVER_AGAIN: Duration = Duration::from_secs(24 * 3600);
/// How long the leaving host waits for a call it took back to be resumed on its own connection.
const TAKEN_BACK_WITHIN: Duration = Duration::from_secs(15);
/// Calls handed to an agent not yet adopted, at most (more wait in NATS).
const ARRIVALS_QUEUED: usize = 16;
/// Offers this host considers at once, at most (more wait in NATS, and time out there).
const OFFERS_AT_ONCE: usize = 64;
/// How long a leaving host takes, at most, to leave the queue group and answer the offers that had
/// reached it.
const DRAIN_WITHIN: Duration = Duration::from_secs(2);
/// The offer's format: a host refuses an offer of another (a rolling upgrade that changed it), and the
/// leaving host takes the call back. 2: saved values in base64.
const FORMAT: u32 = 2;

/// A call offered to the other hosts.
#[derive(Serialize, Deserialize)]
struct Offer {
    format: u32,
    tenant: String,
    agent: String,
    /// The component the call's version runs (`None` when the leaving host no longer knows it: no host
    /// takes such a call).
    digest: Option<String>,
    from: String,
    call: MovingCall,
}

/// A peer's answer to an offer.
#[derive(Serialize, Deserialize)]
struct Answer {
    taken: bool,
    /// Why not, when not taken.
    why: Option<String>,
}

/// Says, when dropped, that this host takes no more offers.
struct OffersClosed<'a>(&'a tokio::sync::watch::Sender<bool>);

impl Drop for OffersClosed<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// A call leaving this host, and whose it is.
pub(super) struct Leaving {
    tenant: String,
    agent: String,
    departure: Departure,
}

/// What the leave did (the metrics count the same per agent).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// Calls a peer took.
    pub handed_over: u64,
    /// Offers no peer took: the call was taken back (and offered again).
    pub taken_back: u64,
    /// Calls still here, or on their way, when the leave's time was up.
    pub left_behind: u64,
}

/// [`Left`], counted by the offers as they go.
#[derive(Default)]
struct Counts {
    handed_over: AtomicU64,
    taken_back: AtomicU64,
}

/// The name a call's claim goes under: a digest of its session and token (never the token itself).
fn claim_name(call: &MovingCall) -> String {
    let mut hash = Sha256::new();
    hash.update(call.call.session_id.as_bytes());
    hash.update([0]);
    hash.update(call.call.token().as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a JSON document did not parse, without the parser's own message (which may quote it: a
/// caller's words, a token).
fn unparsed(error: &serde_json::Error) -> String {
    format!(
        "{:?} error at line {} column {}",
        error.classify(),
        error.line(),
        error.column()
    )
}

impl Tenancy {
    /// The agent's part in handovers, in a cluster: its calls leave into this host's queue of leaving
    /// calls, and calls come to it on the returned sender. `None` outside a cluster.
    pub(super) fn moves_for(
        &self,
        tenant: &str,
        agent: &str,
    ) -> Option<(Moves, mpsc::Sender<Arrival>)> {
        self.shared.as_ref()?;
        let (arrive, arrivals) = mpsc::channel(ARRIVALS_QUEUED);
        let (leavers, tenant, agent) =
            (self.leavers.clone(), tenant.to_string(), agent.to_string());
        let out = Arc::new(move |departure: Departure| {
            leavers
                .send(Leaving {
                    tenant: tenant.clone(),
                    agent: agent.clone(),
                    departure,
                })
                .map_err(|unsent| Box::new(unsent.0.departure))
        });
        let moves = Moves {
            leave: self.leaving.subscribe(),
            out,
            arrive: arrivals,
        };
        Some((moves, arrive))
    }

    /// Takes the calls other hosts offer, until this host leaves (a task of its own, from the start);
    /// then leaves the queue group, declining what NATS sent here meanwhile, and says it no longer takes
    /// any ([`Tenancy::leave`] waits for that before it offers calls of its own).
    pub(super) async fn take_offers(self: Arc<Tenancy>) {
        let _closed = OffersClosed(&self.offers_closed);
        let Some(store) = self.shared.clone() else {
            return;
        };
        let mut leaving = self.leaving.subscribe();
        let at_once = Arc::new(tokio::sync::Semaphore::new(OFFERS_AT_ONCE));
        let mut offers = 'subscribed: loop {
            if *leaving.borrow() {
                return;
            }
            let mut offers = match store.offers().await {
                Ok(offers) => offers,
                Err(error) => {
                    tracing::warn!(%error, "cluster: cannot listen for calls offered; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let left = async {
                // Waited for in a block of its own, so that its borrow of the value ends there.
                let _ = leaving.wait_for(|leaving| *leaving).await;
            };
            tokio::pin!(left);
            loop {
                // A place first (the leave still heard while every place is taken), then an offer.
                let permit = tokio::select! {
                    permit = at_once.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    () = &mut left => break 'subscribed offers,
                };
                tokio::select! {
                    offered = offers.next.recv() => {
                        // The subscription ended (NATS closed it): listen again.
                        let Some(offered) = offered else { continue 'subscribed };
                        let tenancy = self.clone();
                        let store = store.clone();
                        tokio::spawn(async move {
                            tenancy.take_offer(&store, offered).await;
                            drop(permit);
                        });
                    }
                    () = &mut left => break 'subscribed offers,
                }
            }
        };
        // Each offer that had reached this host is answered (declined: this host is leaving), and the
        // answers are out before the leave goes on, so no peer waits out its timeout for them.
        offers.drain();
        let mut declines = tokio::task::JoinSet::new();
        let _ = tokio::time::timeout(DRAIN_WITHIN, async {
            while let Some(offered) = offers.next.recv().await {
                let (tenancy, store) = (self.clone(), store.clone());
                declines.spawn(async move { tenancy.take_offer(&store, offered).await });
            }
            while declines.join_next().await.is_some() {}
            let _ = store.flush().await;
        })
        .await;
    }

    /// One offer: taken if this host serves the agent's same version and the call is nobody's yet, and
    /// answered once Sent has resumed it here (or not).
    async fn take_offer(&self, store: &NatsStore, offered: Offered) {
        let answer = match self.consider(store, &offered.payload).await {
            Ok(()) => Answer {
                taken: true,
                why: None,
            },
            Err(why) => {
                tracing::info!(why, "cluster: a call offered was not taken");
                Answer {
                    taken: false,
                    why: Some(why),
                }
            }
        };
        let answer = serde_json::to_vec(&answer).unwrap_or_default();
        if let Err(error) = store.answer(offered, answer).await {
            tracing::warn!(%error, "cluster: cannot answer a call offered");
        }
    }

    async fn consider(&self, store: &NatsStore, payload: &[u8]) -> Result<(), String> {
        let offer: Offer = serde_json::from_slice(payload)
            .map_err(|e| format!("the offer does not parse ({})", unparsed(&e)))?;
        if offer.format != FORMAT {
            return Err(format!(
                "the offer's format is {}; this host reads {FORMAT}",
                offer.format
            ));
        }
        if *self.leaving.borrow() {
            return Err("this host is leaving".into());
        }
        let arrive = {
            let running = self.running();
            let Some(Running {
                arrive: Some(arrive),
                deployment,
                digest,
                ..
            }) = running.get(&(offer.tenant.clone(), offer.agent.clone()))
            else {
                return Err(format!(
                    "{}/{} is not served here",
                    offer.tenant, offer.agent
                ));
            };
            let version = deployment.borrow().version;
            let same_code = offer.digest.as_deref() == Some(digest.hex());
            if version != offer.call.version || !same_code {
                return Err(format!(
                    "{}/{} serves version {version} here, the call runs version {} (or other code)",
                    offer.tenant, offer.agent, offer.call.version
                ));
            }
            arrive.clone()
        };
        match store.claim(&claim_name(&offer.call), false).await {
            Ok(Claim::Mine) => {}
            Ok(Claim::Taken) => return Err("another host has claimed the call".into()),
            Err(error) => return Err(format!("cannot claim the call: {error}")),
        }
        tracing::info!(
            session = offer.call.call.session_id,
            from = offer.from,
            tenant = offer.tenant,
            agent = offer.agent,
            "cluster: taking a call another host hands over"
        );
        let (resumed, answer) = oneshot::channel();
        let arrival = Arrival {
            call: offer.call,
            kept: None,
            leave_after: Duration::ZERO,
            resumed,
        };
        // Handed to the agent and resumed within the budget, or not taken (the leaving host takes it
        // back; should this host's resume still be answered later, Sent refuses one of the two).
        let taken = tokio::time::timeout(RESUME_WITHIN, async {
            arrive.send(arrival).await.ok()?;
            answer.await.ok()
        })
        .await;
        match taken {
            Ok(Some(true)) => Ok(()),
            Ok(_) => Err("Sent did not resume the call here".into()),
            Err(_) => Err(format!(
                "Sent did not answer the resume in {} s",
                RESUME_WITHIN.as_secs()
            )),
        }
    }

    /// Leaves the cluster's calls (SIGTERM in cluster mode): takes no more offers, lets every call that
    /// can move leave and hands each to a peer, until this host carries no call or `within` has passed.
    /// Outside a cluster it does nothing. Returns what it did.
    pub async fn leave(self: &Arc<Tenancy>, within: Duration) -> Left {
        let Some(store) = self.shared.clone() else {
            return Left::default();
        };
        let Some(mut leavers) = self
            .leaving_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Left::default();
        };
        let counts = Arc::new(Counts::default());
        let mut left_behind = 0;
        tracing::info!(
            within_s = within.as_secs(),
            calls = self.live_calls(),
            "cluster: leaving: handing every call that can move to another host"
        );
        let deadline = tokio::time::Instant::now() + within;
        self.leaving.send_replace(true);
        // Out of the queue group before the first offer (an unsubscribe and an offer of one client reach
        // NATS in order): none of this host's calls is offered to itself.
        let mut closed = self.offers_closed.subscribe();
        let drained =
            deadline.min(tokio::time::Instant::now() + DRAIN_WITHIN + Duration::from_secs(1));
        let _ = tokio::time::timeout_at(drained, closed.wait_for(|closed| *closed)).await;
        let mut offers = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                leaving = leavers.recv() => {
                    let Some(leaving) = leaving else { break };
                    let (tenancy, store, counts) = (self.clone(), store.clone(), counts.clone());
                    offers.spawn(async move { tenancy.hand_over(&store, leaving, &counts).await });
                }
                Some(_) = offers.join_next(), if !offers.is_empty() => {}
                _ = tick.tick() => {
                    // A call taken back is listed live before its offer's task ends.
                    if offers.is_empty() && leavers.is_empty() && self.live_calls() == 0 {
                        break;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    left_behind = (self.live_calls() + offers.len() + leavers.len()) as u64;
                    break;
                }
            }
        }
        offers.shutdown().await;
        let left = Left {
            handed_over: counts.handed_over.load(Ordering::Relaxed),
            taken_back: counts.taken_back.load(Ordering::Relaxed),
            left_behind,
        };
        tracing::info!(
            handed_over = left.handed_over,
            taken_back = left.taken_back,
            left_behind = left.left_behind,
            "cluster: left"
        );
        left
    }

    /// Offers one leaving call; takes it back when no peer took it.
    async fn hand_over(&self, store: &NatsStore, leaving: Leaving, counts: &Counts) {
        let Leaving {
            tenant,
            agent,
            departure: Departure { call, kept },
        } = leaving;
        let session = call.call.session_id.clone();
        let digest = self
            .running()
            .get(&(tenant.clone(), agent.clone()))
            .and_then(|r| r.digests.get(&call.version).map(|d| d.hex().to_string()));
        let offer = Offer {
            format: FORMAT,
            tenant: tenant.clone(),
            agent: agent.clone(),
            digest,
            from: store.host_id().to_string(),
            call,
        };
        let payload = serde_json::to_vec(&offer).unwrap_or_default();
        let mut offer_again_after = OFFER_AGAIN_AFTER;
        let why = match store.offer(payload).await {
            Ok(answer) => match serde_json::from_slice::<Answer>(&answer) {
                Ok(Answer { taken: true, .. }) => {
                    counts.handed_over.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(session, tenant, agent, "cluster: a call was handed over");
                    return;
                }
                Ok(Answer { why, .. }) => why.unwrap_or_default(),
                Err(error) => format!("the answer does not parse ({})", unparsed(&error)),
            },
            Err(error @ OfferError::TooLarge(_)) => {
                // It never will fit: it stays here until the leave is over.
                offer_again_after = NEVER_AGAIN;
                error.to_string()
            }
            Err(error) => error.to_string(),
        };
        // Nobody took it: it is this host's again (a peer that claimed it and died before resuming it
        // never will).
        counts.taken_back.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            session,
            tenant,
            agent,
            why,
            "cluster: no host took the call: taking it back"
        );
        let call = offer.call;
        if let Err(error) = store.claim(&claim_name(&call), true).await {
            tracing::warn!(session, %error, "cluster: cannot claim back a call; resuming it anyway");
        }
        let arrive = self
            .running()
            .get(&(tenant, agent))
            .and_then(|r| r.arrive.clone());
        let (resumed, answer) = oneshot::channel();
        let arrival = Arrival {
            call,
            kept: Some(kept),
            leave_after: offer_again_after,
            resumed,
        };
        match arrive {
            // Waited for, so that the leave goes on while the call is on its way back.
            Some(arrive) if arrive.send(arrival).await.is_ok() => {
                if !matches!(
                    tokio::time::timeout(TAKEN_BACK_WITHIN, answer).await,
                    Ok(Ok(true))
                ) {
                    tracing::warn!(session, "cluster: a call taken back was not resumed here");
                }
            }
            _ => tracing::warn!(
                session,
                "cluster: the agent is no longer served here: the call is left to Sent's resume window"
            ),
        }
    }

    /// Live calls on this host, all agents together.
    fn live_calls(&self) -> usize {
        self.running().values().map(|r| r.stats.live_count()).sum()
    }
}
