use super::*;
use crate::protocol::ValueBatch;

struct Add;

impl ModelFunctions for Add {
    fn value_len(&self) -> usize {
        2
    }
    fn init(&self, key: Key) -> Vec<f32> {
        vec![key as f32, 0.0]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v += d;
        }
    }
}

const BLOCKS: u32 = 4;

fn store(me: EvaluatorId) -> Store {
    let s = Store::new(me);
    s.configure(
        &[(MODEL_TABLE, BLOCKS), (INPUT_TABLE, 2), (STATE_TABLE, 2)],
        Arc::new(Add),
    );
    s
}

fn keys_in_block(b: BlockId, n: usize) -> Vec<Key> {
    (0..10_000u64)
        .filter(|&k| block_of_key(k, BLOCKS) == b)
        .take(n)
        .collect()
}

fn get(keys: &[Key]) -> StoreOp {
    StoreOp {
        kind: OpKind::Get,
        table: MODEL_TABLE,
        keys: keys.to_vec(),
        values: ValueBatch::default(),
    }
}

fn update(keys: &[Key], d: f32) -> StoreOp {
    let mut values = ValueBatch::default();
    for _ in keys {
        values.push(&[d, 1.0]);
    }
    StoreOp {
        kind: OpKind::Update,
        table: MODEL_TABLE,
        keys: keys.to_vec(),
        values,
    }
}

fn ready(sub: Submission) -> PeerResponse {
    let mut parts = Vec::new();
    for p in sub.parts {
        match p.pending {
            Pending::Ready(r) => parts.push((p.positions, r.unwrap())),
            _ => panic!("expected only local parts"),
        }
    }
    assemble(sub.kind, sub.keys, parts).unwrap()
}

fn values(r: PeerResponse) -> Vec<Vec<f32>> {
    match r {
        PeerResponse::Values(b) => b.iter().map(<[f32]>::to_vec).collect(),
        other => panic!("expected values, got {other:?}"),
    }
}

#[test]
fn local_get_and_update_use_init_and_update_fn() {
    let s = store(EvaluatorId(1));
    s.create_blocks(
        MODEL_TABLE,
        &[BlockId(0), BlockId(1), BlockId(2), BlockId(3)],
    )
    .unwrap();
    let keys = [5u64, 17, 3];
    assert_eq!(
        values(ready(s.submit(&get(&keys)).unwrap())),
        vec![vec![5.0, 0.0], vec![17.0, 0.0], vec![3.0, 0.0]]
    );
    ready(s.submit(&update(&keys, 2.0)).unwrap());
    ready(s.submit(&update(&keys[..1], 1.0)).unwrap());
    assert_eq!(
        values(ready(s.submit(&get(&keys)).unwrap())),
        vec![vec![8.0, 2.0], vec![19.0, 1.0], vec![5.0, 1.0]]
    );
}

/// A read partly of blocks held here answers the keys read here, in the
/// operation's order, and forwards the rest; one wholly here answers all.
#[test]
fn a_read_partly_here_answers_the_keys_held_here() {
    let s = store(EvaluatorId(1));
    s.create_blocks(MODEL_TABLE, &[BlockId(0), BlockId(2)])
        .unwrap();
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: vec![
            (MODEL_TABLE, BlockId(0), EvaluatorId(1)),
            (MODEL_TABLE, BlockId(1), EvaluatorId(2)),
            (MODEL_TABLE, BlockId(2), EvaluatorId(1)),
            (MODEL_TABLE, BlockId(3), EvaluatorId(2)),
        ],
    });
    // Interleaved: blocks 2, 1, 0, 3, 2, 0, 1.
    let keys: Vec<Key> = [2, 1, 0, 3, 2, 0, 1]
        .iter()
        .enumerate()
        .map(|(i, &b)| keys_in_block(BlockId(b), 3)[i % 3])
        .collect();
    let here: Vec<usize> = vec![0, 2, 4, 5];
    let sub = s.submit(&get(&keys)).unwrap();
    let mut seen = 0;
    for p in sub.parts {
        match p.pending {
            Pending::Ready(Ok(PeerResponse::Values(v))) => {
                assert_eq!(p.positions, here);
                let want: Vec<Vec<f32>> = here.iter().map(|&i| vec![keys[i] as f32, 0.0]).collect();
                assert_eq!(v.iter().map(<[f32]>::to_vec).collect::<Vec<_>>(), want);
                seen += p.positions.len();
            }
            Pending::Forward { to, .. } => {
                assert_eq!(to, EvaluatorId(2));
                seen += p.positions.len();
            }
            _ => panic!("read here or forwarded"),
        }
    }
    assert_eq!(seen, keys.len());
    let local: Vec<Key> = here.iter().map(|&i| keys[i]).collect();
    let v = values(ready(s.submit(&get(&local)).unwrap()));
    let want: Vec<Vec<f32>> = local.iter().map(|&k| vec![k as f32, 0.0]).collect();
    assert_eq!(v, want);
}

#[test]
fn absent_blocks_are_forwarded_to_their_owner_grouped() {
    let s = store(EvaluatorId(1));
    s.create_blocks(MODEL_TABLE, &[BlockId(0)]).unwrap();
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: vec![
            (MODEL_TABLE, BlockId(0), EvaluatorId(1)),
            (MODEL_TABLE, BlockId(1), EvaluatorId(2)),
            (MODEL_TABLE, BlockId(2), EvaluatorId(2)),
            (MODEL_TABLE, BlockId(3), EvaluatorId(3)),
        ],
    });
    let mut keys = keys_in_block(BlockId(0), 2);
    keys.extend(keys_in_block(BlockId(1), 2));
    keys.extend(keys_in_block(BlockId(2), 1));
    keys.extend(keys_in_block(BlockId(3), 1));
    let sub = s.submit(&update(&keys, 1.0)).unwrap();
    let mut fwd: Vec<(EvaluatorId, Vec<usize>, usize)> = Vec::new();
    let mut local = 0;
    for p in sub.parts {
        match p.pending {
            Pending::Ready(r) => {
                r.unwrap();
                local += p.positions.len();
            }
            Pending::Forward { to, op, .. } => {
                assert_eq!(op.keys.len(), op.values.len());
                for (i, &pos) in p.positions.iter().enumerate() {
                    assert_eq!(op.keys[i], keys[pos], "forwarded keys match positions");
                }
                fwd.push((to, p.positions, op.keys.len()));
            }
            Pending::Queued(_) => panic!("nothing is in flight"),
        }
    }
    assert_eq!(local, 2);
    fwd.sort();
    assert_eq!(
        fwd.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(),
        vec![(EvaluatorId(2), 3), (EvaluatorId(3), 1)]
    );
}

/// An operation whose blocks all live on one other evaluator goes there
/// whole (the fast path), keys and values as given; as soon as one block is
/// held or arriving here, or another evaluator owns one, it is split by
/// owner as before.
#[tokio::test]
async fn one_remote_owner_gets_the_operation_whole() {
    let s = store(EvaluatorId(1));
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: BlockId::all(BLOCKS)
            .map(|b| (MODEL_TABLE, b, EvaluatorId(2)))
            .collect(),
    });
    let keys: Vec<Key> = (0..BLOCKS)
        .flat_map(|b| keys_in_block(BlockId(b), 3))
        .collect();
    let forwarded = |op: &StoreOp| -> Vec<(Vec<usize>, Pending)> {
        s.submit(op)
            .unwrap()
            .parts
            .into_iter()
            .map(|p| (p.positions, p.pending))
            .collect()
    };
    for op in [get(&keys), update(&keys, 2.0)] {
        let parts = forwarded(&op);
        assert_eq!(parts.len(), 1, "one request");
        let (positions, pending) = &parts[0];
        assert_eq!(*positions, (0..keys.len()).collect::<Vec<_>>());
        match pending {
            Pending::Forward {
                to: EvaluatorId(2),
                op: sent,
                values: None,
            } => assert_eq!(*sent, op, "sent as given"),
            _ => panic!("expected a forward to evaluator 2"),
        }
    }
    // A block arriving here: its keys wait for it, the rest go to 2.
    s.begin_incoming(MODEL_TABLE, BlockId(1), EvaluatorId(2))
        .unwrap();
    let parts = forwarded(&update(&keys, 2.0));
    assert!(
        parts.iter().any(|(_, p)| matches!(p, Pending::Queued(_))),
        "the arriving block's keys are queued"
    );
    assert!(
        parts.iter().any(|(pos, p)| matches!(
            p,
            Pending::Forward {
                to: EvaluatorId(2),
                ..
            }
        ) && pos.len() == 9),
        "the others go to their owner"
    );
    // Another owner for one block: one request per owner.
    let t = store(EvaluatorId(1));
    t.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: BlockId::all(BLOCKS)
            .map(|b| {
                (
                    MODEL_TABLE,
                    b,
                    EvaluatorId(if b == BlockId(3) { 3 } else { 2 }),
                )
            })
            .collect(),
    });
    let mut to: Vec<EvaluatorId> = t
        .submit(&get(&keys))
        .unwrap()
        .parts
        .into_iter()
        .map(|p| match p.pending {
            Pending::Forward { to, .. } => to,
            _ => panic!("expected forwards only"),
        })
        .collect();
    to.sort_unstable();
    assert_eq!(to, [EvaluatorId(2), EvaluatorId(3)]);
}

#[test]
fn unknown_owner_is_retryable() {
    let s = store(EvaluatorId(1));
    let sub = s.submit(&get(&[1])).unwrap();
    match &sub.parts[0].pending {
        Pending::Ready(Err(e)) => assert!(e.retry, "{e}"),
        _ => panic!("expected a retryable error"),
    }
}

#[tokio::test]
async fn incoming_block_queues_then_applies_in_order() {
    let src = store(EvaluatorId(1));
    let dst = store(EvaluatorId(2));
    src.create_blocks(MODEL_TABLE, &[BlockId(0)]).unwrap();
    let k = keys_in_block(BlockId(0), 1);
    ready(src.submit(&update(&k, 1.0)).unwrap()); // applied at the source

    dst.begin_incoming(MODEL_TABLE, BlockId(0), EvaluatorId(1))
        .unwrap();
    let data = src
        .take_for_move(MODEL_TABLE, BlockId(0), EvaluatorId(2))
        .unwrap();
    // The source now forwards.
    let sub = src.submit(&update(&k, 10.0)).unwrap();
    let Pending::Forward { to, op, .. } = sub.parts.into_iter().next().unwrap().pending else {
        panic!("expected forward")
    };
    assert_eq!(to, EvaluatorId(2));
    // The destination queues the forwarded update and a read after it.
    let q1 = dst.submit(&op).unwrap();
    let q2 = dst.submit(&get(&k)).unwrap();
    let rx1 = match q1.parts.into_iter().next().unwrap().pending {
        Pending::Queued(rx) => rx,
        _ => panic!("expected queued"),
    };
    let rx2 = match q2.parts.into_iter().next().unwrap().pending {
        Pending::Queued(rx) => rx,
        _ => panic!("expected queued"),
    };
    // Data lands: encoded and decoded like a real move.
    let data = BlockData::decode(&data.encode()).unwrap();
    dst.install(MODEL_TABLE, BlockId(0), data).unwrap();
    src.finish_move(MODEL_TABLE, BlockId(0)).unwrap();
    assert_eq!(rx1.await.unwrap().unwrap(), PeerResponse::Done);
    let v = values(rx2.await.unwrap().unwrap());
    assert_eq!(
        v[0],
        vec![k[0] as f32 + 11.0, 2.0],
        "both updates, once each, in order"
    );
    assert_eq!(dst.local_blocks(MODEL_TABLE), vec![BlockId(0)]);
    assert!(src.local_blocks(MODEL_TABLE).is_empty());
}

#[tokio::test]
async fn aborted_move_restores_source_and_fails_queue_retryably() {
    let src = store(EvaluatorId(1));
    let dst = store(EvaluatorId(2));
    src.create_blocks(MODEL_TABLE, &[BlockId(1)]).unwrap();
    let k = keys_in_block(BlockId(1), 1);
    dst.begin_incoming(MODEL_TABLE, BlockId(1), EvaluatorId(1))
        .unwrap();
    let data = src
        .take_for_move(MODEL_TABLE, BlockId(1), EvaluatorId(2))
        .unwrap();
    let q = dst.submit(&update(&k, 5.0)).unwrap();
    let Pending::Queued(rx) = q.parts.into_iter().next().unwrap().pending else {
        panic!("expected queued")
    };
    src.restore(MODEL_TABLE, BlockId(1), data).unwrap();
    assert_eq!(
        dst.abort_incoming(MODEL_TABLE, BlockId(1)).unwrap(),
        AbortOutcome::Aborted
    );
    assert_eq!(
        dst.abort_incoming(MODEL_TABLE, BlockId(1)).unwrap(),
        AbortOutcome::Aborted,
        "calling off twice is harmless"
    );
    let err = rx.await.unwrap().unwrap_err();
    assert!(err.retry, "{err}");
    // The source owns it again and the queued update was not applied anywhere.
    assert_eq!(
        values(ready(src.submit(&get(&k)).unwrap()))[0],
        vec![k[0] as f32, 0.0]
    );
    // The destination now forwards to the source.
    let sub = dst.submit(&get(&k)).unwrap();
    assert!(matches!(
        sub.parts[0].pending,
        Pending::Forward {
            to: EvaluatorId(1),
            ..
        }
    ));
}

#[test]
fn illegal_transitions_are_errors() {
    let s = store(EvaluatorId(1));
    s.create_blocks(MODEL_TABLE, &[BlockId(0)]).unwrap();
    assert!(
        s.begin_incoming(MODEL_TABLE, BlockId(0), EvaluatorId(2))
            .is_err(),
        "cannot receive an owned block"
    );
    assert!(
        s.take_for_move(MODEL_TABLE, BlockId(1), EvaluatorId(2))
            .is_err(),
        "cannot move an absent block"
    );
    assert!(
        s.install(
            MODEL_TABLE,
            BlockId(1),
            BlockData::Keyed(KeyedBlock::default())
        )
        .is_err()
    );
    assert!(
        s.take_for_move(MODEL_TABLE, BlockId(9), EvaluatorId(2))
            .is_err(),
        "no such block"
    );
    assert!(
        s.submit(&StoreOp {
            table: INPUT_TABLE,
            ..get(&[1])
        })
        .is_err(),
        "input is not keyed"
    );
    let bad = StoreOp {
        values: ValueBatch::default(),
        ..update(&[1], 1.0)
    };
    assert!(s.submit(&bad).is_err(), "values must match keys");
}

#[test]
fn wrong_value_length_rejected_not_applied() {
    let s = store(EvaluatorId(1));
    s.create_blocks(
        MODEL_TABLE,
        &[BlockId(0), BlockId(1), BlockId(2), BlockId(3)],
    )
    .unwrap();
    let mut values = ValueBatch::default();
    values.push(&[1.0, 2.0, 3.0]);
    let op = StoreOp {
        kind: OpKind::Update,
        table: MODEL_TABLE,
        keys: vec![7],
        values,
    };
    let sub = s.submit(&op).unwrap();
    assert!(matches!(&sub.parts[0].pending, Pending::Ready(Err(e)) if !e.retry));
    assert_eq!(values_of(&s, 7), vec![7.0, 0.0]);
}

fn values_of(s: &Store, k: Key) -> Vec<f32> {
    values(ready(s.submit(&get(&[k])).unwrap())).remove(0)
}

#[test]
fn ownership_updates_apply_only_when_newer() {
    let s = store(EvaluatorId(1));
    assert_eq!(
        s.apply_ownership(&OwnershipUpdate {
            version: 2,
            owners: vec![(MODEL_TABLE, BlockId(0), EvaluatorId(7))]
        }),
        2
    );
    assert_eq!(
        s.apply_ownership(&OwnershipUpdate {
            version: 1,
            owners: vec![(MODEL_TABLE, BlockId(0), EvaluatorId(8))]
        }),
        2
    );
    assert_eq!(s.owner(MODEL_TABLE, BlockId(0)), Some(EvaluatorId(7)));
}

#[test]
fn owners_of_a_table_are_counted_once_each() {
    let s = store(EvaluatorId(1));
    assert_eq!(s.owner_count(MODEL_TABLE), 0);
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: vec![
            (MODEL_TABLE, BlockId(0), EvaluatorId(7)),
            (MODEL_TABLE, BlockId(1), EvaluatorId(7)),
        ],
    });
    assert_eq!(s.owner_count(MODEL_TABLE), 1);
    s.apply_ownership(&OwnershipUpdate {
        version: 2,
        owners: vec![(MODEL_TABLE, BlockId(1), EvaluatorId(8))],
    });
    assert_eq!(s.owner_count(MODEL_TABLE), 2);
}

/// A handover's pointer is followed while this evaluator's view of the
/// owners still names it; once the view names another owner (the block
/// moved on) the view is newer and is followed, whether or not the
/// pointer's target is still there.
#[test]
fn a_handover_pointer_gives_way_to_a_newer_view() {
    let to = |s: &Store, k: &[Key]| match s.submit(&get(k)).unwrap().parts[0].pending {
        Pending::Forward { to, .. } => Some(to),
        _ => None,
    };
    let s = store(EvaluatorId(1));
    s.create_blocks(MODEL_TABLE, &[BlockId(2)]).unwrap();
    s.apply_ownership(&OwnershipUpdate {
        version: 2,
        owners: vec![(MODEL_TABLE, BlockId(2), EvaluatorId(1))],
    });
    let _ = s
        .take_for_move(MODEL_TABLE, BlockId(2), EvaluatorId(4))
        .unwrap();
    s.finish_move(MODEL_TABLE, BlockId(2)).unwrap();
    let k = keys_in_block(BlockId(2), 1);
    assert_eq!(
        to(&s, &k),
        Some(EvaluatorId(4)),
        "the view names this one: the pointer"
    );
    s.apply_ownership(&OwnershipUpdate {
        version: 3,
        owners: vec![(MODEL_TABLE, BlockId(2), EvaluatorId(4))],
    });
    assert_eq!(to(&s, &k), Some(EvaluatorId(4)), "the view caught up");
    // 4 passed the block on to 6 (and may be about to leave).
    s.apply_ownership(&OwnershipUpdate {
        version: 4,
        owners: vec![(MODEL_TABLE, BlockId(2), EvaluatorId(6))],
    });
    assert_eq!(to(&s, &k), Some(EvaluatorId(6)), "not through 4");
    s.set_departed([EvaluatorId(4)]);
    assert_eq!(to(&s, &k), Some(EvaluatorId(6)), "4 left");
}

/// A pointer to an evaluator that left is not followed: the view is.
#[test]
fn departed_forward_target_falls_back_to_owner_view() {
    let s = store(EvaluatorId(1));
    s.create_blocks(MODEL_TABLE, &[BlockId(2)]).unwrap();
    let _ = s
        .take_for_move(MODEL_TABLE, BlockId(2), EvaluatorId(4))
        .unwrap();
    s.finish_move(MODEL_TABLE, BlockId(2)).unwrap();
    let k = keys_in_block(BlockId(2), 1);
    let sub = s.submit(&get(&k)).unwrap();
    assert!(
        matches!(
            sub.parts[0].pending,
            Pending::Forward {
                to: EvaluatorId(4),
                ..
            }
        ),
        "follows the pointer"
    );
    s.set_departed([EvaluatorId(4)]);
    s.apply_ownership(&OwnershipUpdate {
        version: 3,
        owners: vec![(MODEL_TABLE, BlockId(2), EvaluatorId(6))],
    });
    let sub = s.submit(&get(&k)).unwrap();
    assert!(
        matches!(
            sub.parts[0].pending,
            Pending::Forward {
                to: EvaluatorId(6),
                ..
            }
        ),
        "4 left: use the view"
    );
}

#[test]
fn state_blocks_are_held_during_access() {
    let s = store(EvaluatorId(1));
    s.put_block(
        STATE_TABLE,
        BlockId(0),
        BlockData::State(StateBlock {
            floats: vec![1.0],
            ints: vec![],
        }),
    )
    .unwrap();
    let r = s.with_state(BlockId(0), |st| {
        st.floats[0] += 1.0;
        st.floats[0]
    });
    assert_eq!(r, Some(2.0));
    let d = s
        .take_for_move(STATE_TABLE, BlockId(0), EvaluatorId(2))
        .unwrap();
    assert_eq!(s.with_state(BlockId(0), |_| ()), None, "moved away");
    assert_eq!(
        d,
        BlockData::State(StateBlock {
            floats: vec![2.0],
            ints: vec![]
        })
    );
}

/// The source's transfer failed after the block landed (the answer was lost
/// with the connection): the source recalls the block, the destination says
/// it is installed, and the source's queue goes there. One owner, every
/// operation applied once.
#[tokio::test]
async fn recall_after_a_lost_answer_hands_the_queue_to_the_destination() {
    let src = store(EvaluatorId(1));
    let dst = store(EvaluatorId(2));
    src.create_blocks(MODEL_TABLE, &[BlockId(2)]).unwrap();
    let k = keys_in_block(BlockId(2), 1);
    dst.begin_incoming(MODEL_TABLE, BlockId(2), EvaluatorId(1))
        .unwrap();
    let data = src
        .take_for_move(MODEL_TABLE, BlockId(2), EvaluatorId(2))
        .unwrap();
    dst.install(MODEL_TABLE, BlockId(2), data.clone()).unwrap();
    // The source did not hear back: it queues operations and asks.
    src.recall(MODEL_TABLE, BlockId(2)).unwrap();
    assert_eq!(
        src.slot_kind(MODEL_TABLE, BlockId(2)).unwrap(),
        SlotKind::Incoming
    );
    let q = src.submit(&update(&k, 3.0)).unwrap();
    let Pending::Queued(rx) = q.parts.into_iter().next().unwrap().pending else {
        panic!("expected queued at the recalling source")
    };
    assert_eq!(
        dst.abort_incoming(MODEL_TABLE, BlockId(2)).unwrap(),
        AbortOutcome::Installed
    );
    src.abort_incoming(MODEL_TABLE, BlockId(2)).unwrap();
    let err = rx.await.unwrap().unwrap_err();
    assert!(err.retry, "the queued update was not applied: {err}");
    assert_eq!(
        src.slot_kind(MODEL_TABLE, BlockId(2)).unwrap(),
        SlotKind::MovedAway
    );
    assert_eq!(
        dst.slot_kind(MODEL_TABLE, BlockId(2)).unwrap(),
        SlotKind::Owned
    );
    // Sent again, it is forwarded to the destination and applied there once.
    let sub = src.submit(&update(&k, 3.0)).unwrap();
    let Pending::Forward {
        to: EvaluatorId(2),
        op,
        values: None,
    } = sub.parts.into_iter().next().unwrap().pending
    else {
        panic!("expected a forward to the destination")
    };
    ready(dst.submit(&op).unwrap());
    assert_eq!(
        values(ready(dst.submit(&get(&k)).unwrap()))[0],
        vec![k[0] as f32 + 3.0, 1.0]
    );
}

/// The destination never got the block: the recalling source installs its
/// own data and applies what queued meanwhile.
#[tokio::test]
async fn recall_then_not_installed_restores_and_applies_the_queue() {
    let src = store(EvaluatorId(1));
    let dst = store(EvaluatorId(2));
    src.create_blocks(MODEL_TABLE, &[BlockId(3)]).unwrap();
    let k = keys_in_block(BlockId(3), 1);
    dst.begin_incoming(MODEL_TABLE, BlockId(3), EvaluatorId(1))
        .unwrap();
    let data = src
        .take_for_move(MODEL_TABLE, BlockId(3), EvaluatorId(2))
        .unwrap();
    src.recall(MODEL_TABLE, BlockId(3)).unwrap();
    let q = src.submit(&update(&k, 4.0)).unwrap();
    let Pending::Queued(rx) = q.parts.into_iter().next().unwrap().pending else {
        panic!("expected queued")
    };
    assert_eq!(
        dst.abort_incoming(MODEL_TABLE, BlockId(3)).unwrap(),
        AbortOutcome::Aborted
    );
    src.install(MODEL_TABLE, BlockId(3), data).unwrap();
    assert_eq!(rx.await.unwrap().unwrap(), PeerResponse::Done);
    assert_eq!(
        values(ready(src.submit(&get(&k)).unwrap()))[0],
        vec![k[0] as f32 + 4.0, 1.0]
    );
    assert_eq!(
        dst.slot_kind(MODEL_TABLE, BlockId(3)).unwrap(),
        SlotKind::MovedAway
    );
    assert!(
        src.recall(MODEL_TABLE, BlockId(3)).is_err(),
        "only a block moving out"
    );
}

struct Wide;

impl ModelFunctions for Wide {
    fn value_len(&self) -> usize {
        1024
    }
    fn init(&self, key: Key) -> Vec<f32> {
        vec![key as f32; 1024]
    }
    fn update(&self, _key: Key, value: &mut [f32], delta: &[f32]) {
        for (v, d) in value.iter_mut().zip(delta) {
            *v += d;
        }
    }
}

/// A read larger than MAX_REQUEST_VALUE_BYTES goes to its owner as several
/// requests, each a run of the operation's keys in order; the answers,
/// whatever order they come in, reassemble into the answer.
#[test]
fn large_reads_are_split_in_key_order_and_reassembled() {
    let s = Store::new(EvaluatorId(1));
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(Wide));
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: BlockId::all(BLOCKS)
            .map(|b| (MODEL_TABLE, b, EvaluatorId(2)))
            .collect(),
    });
    let n = 3000usize; // 12 MB of values: three requests
    let keys: Vec<Key> = (0..n as u64).rev().collect();
    let sub = s.submit(&get(&keys)).unwrap();
    assert_eq!(sub.parts.len(), 3);
    let mut answers = Vec::new();
    let mut next = 0;
    for p in sub.parts {
        let Pending::Forward {
            to: EvaluatorId(2),
            op,
            values: None,
        } = p.pending
        else {
            panic!("expected forwards to evaluator 2")
        };
        assert!(op.keys.len() * 4096 <= MAX_REQUEST_VALUE_BYTES);
        assert_eq!(
            p.positions,
            (next..next + op.keys.len()).collect::<Vec<_>>()
        );
        next += op.keys.len();
        let expected: Vec<Key> = p.positions.iter().map(|&i| keys[i]).collect();
        assert_eq!(op.keys, expected, "keys in the operation's order");
        let mut b = ValueBatch::default();
        for &k in &op.keys {
            b.push(&Wide.init(k));
        }
        answers.push((p.positions, PeerResponse::Values(b)));
    }
    assert_eq!(next, n);
    answers.reverse();
    let v = values(assemble(OpKind::Get, n, answers).unwrap());
    for (i, row) in v.iter().enumerate() {
        assert_eq!(row.len(), 1024);
        assert_eq!(row[0], keys[i] as f32, "key {i}");
    }
}

/// A large write is split the same way; a read served here is answered in
/// one piece laid out in the operation's order.
#[test]
fn large_writes_split_and_local_reads_come_back_in_order() {
    let s = Store::new(EvaluatorId(1));
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(Wide));
    s.apply_ownership(&OwnershipUpdate {
        version: 1,
        owners: BlockId::all(BLOCKS)
            .map(|b| (MODEL_TABLE, b, EvaluatorId(2)))
            .collect(),
    });
    let op = wide_update(2100);
    let keys = op.keys.clone();
    let sub = s.submit(&op).unwrap();
    assert_eq!(sub.parts.len(), 3);
    // The owner applies them.
    let owner = Store::new(EvaluatorId(2));
    owner.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(Wide));
    owner
        .create_blocks(MODEL_TABLE, &BlockId::all(BLOCKS).collect::<Vec<_>>())
        .unwrap();
    for p in sub.parts {
        let Pending::Forward { op, .. } = p.pending else {
            panic!("expected forwards")
        };
        ready(owner.submit(&op).unwrap());
    }
    let v = values(ready(owner.submit(&get(&keys)).unwrap()));
    for (i, row) in v.iter().enumerate() {
        assert_eq!(row[1023], 2.0 * i as f32, "init + delta of key {i}");
    }
}

/// An update of keys `0..n`, each by 1024 floats of its own number.
fn wide_update(n: usize) -> StoreOp {
    let keys: Vec<Key> = (0..n as u64).collect();
    let mut deltas = ValueBatch::default();
    for &k in &keys {
        deltas.push(&[k as f32; 1024]);
    }
    StoreOp {
        kind: OpKind::Update,
        table: MODEL_TABLE,
        keys,
        values: deltas,
    }
}

/// `submit_ranges` splits as `submit` does, but its forwarded parts of a
/// write name their values as ranges of the operation's instead of copies;
/// a read, and a write whose parts are not runs, are as from `submit`.
#[test]
fn forwarded_writes_name_their_values_by_range() {
    let s = Store::new(EvaluatorId(1));
    s.configure(&[(MODEL_TABLE, BLOCKS)], Arc::new(Wide));
    // Every block elsewhere: all with one owner, or two by parity.
    for (version, (n, one_owner)) in [(2100usize, true), (30, true), (2100, false)]
        .into_iter()
        .enumerate()
    {
        s.apply_ownership(&OwnershipUpdate {
            version: version as u64 + 1,
            owners: BlockId::all(BLOCKS)
                .map(|b| {
                    let to = if one_owner { 2 } else { 2 + b.0 % 2 };
                    (MODEL_TABLE, b, EvaluatorId(to))
                })
                .collect(),
        });
        let op = wide_update(n);
        let copied = s.submit(&op).unwrap();
        let ranged = s.submit_ranges(&op).unwrap();
        assert_eq!(copied.parts.len(), ranged.parts.len());
        for (c, r) in copied.parts.into_iter().zip(ranged.parts) {
            assert_eq!(c.positions, r.positions);
            let (
                Pending::Forward {
                    to: ct,
                    op: cop,
                    values: None,
                },
                Pending::Forward {
                    to: rt,
                    op: mut rop,
                    values,
                },
            ) = (c.pending, r.pending)
            else {
                panic!("expected forwards");
            };
            assert_eq!(ct, rt);
            match values {
                Some(range) => {
                    assert!(one_owner, "parts to two owners are not runs");
                    assert!(rop.values.data.is_empty());
                    rop.values.data = op.values.data[range].to_vec();
                }
                None => assert!(!one_owner, "a run is forwarded by range"),
            }
            assert_eq!(cop, rop);
        }
        let read = s.submit_ranges(&get(&op.keys)).unwrap();
        assert!(
            read.parts
                .iter()
                .all(|p| matches!(p.pending, Pending::Forward { values: None, .. }))
        );
    }
}

proptest::proptest! {
    /// Both ways of grouping (counting sort for few blocks, sort for many)
    /// give every position once, grouped by block in block order and in
    /// position order within a block.
    #[test]
    fn positions_are_grouped_by_block_in_order(
        blocks in proptest::collection::vec(0u32..5000, 0..300),
        few in proptest::bool::ANY,
    ) {
        let nblocks = if few { 64 } else { 5000 };
        let blocks: Vec<BlockId> = blocks.into_iter().map(|b| BlockId(b % nblocks)).collect();
        let (starts, order) = group_by_block(&blocks, nblocks);
        let mut expected: Vec<(BlockId, u32)> =
            blocks.iter().enumerate().map(|(p, &b)| (b, p as u32)).collect();
        expected.sort_unstable();
        let got: Vec<(BlockId, u32)> = order.iter().map(|&p| (blocks[p as usize], p)).collect();
        proptest::prop_assert_eq!(&got, &expected);
        proptest::prop_assert_eq!(starts.last().copied(), Some((BlockId(nblocks), blocks.len() as u32)));
        for w in starts.windows(2) {
            proptest::prop_assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1);
            for &p in &order[w[0].1 as usize..w[1].1 as usize] {
                proptest::prop_assert_eq!(blocks[p as usize], w[0].0);
            }
        }
    }
}
