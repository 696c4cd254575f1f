//! Snapshot JSON: the shape a metrics dump / what-if tool uses, and clear errors.

use cruise_optimizer::{CostModel, OptimizerError, Role, Snapshot, solve};

const EXAMPLE: &str = r#"{
  "job": {
    "total_records": 100000,
    "mini_batch_size": 1000,
    "bytes_per_mini_batch": 4000000.0,
    "input_blocks": 8,
    "model_blocks": 4,
    "remaining_epochs": 20.0,
    "input_bytes": 800000000,
    "model_bytes": 40000000
  },
  "containers": [
    {"id": "e1", "role": "worker", "compute_secs_per_record": 0.0001,
     "bandwidth_bytes_per_sec": 1.25e8, "input_blocks": 4, "mini_batches": 30},
    {"id": "e2", "role": "worker", "compute_secs_per_record": 0.00012,
     "bandwidth_bytes_per_sec": 1.25e8, "input_blocks": 4, "mini_batches": 30},
    {"id": "e3", "role": "server", "bandwidth_bytes_per_sec": 1.25e8,
     "server_secs_per_byte": 1e-9, "cpu_speed": 1.0, "model_blocks": 4},
    {"id": "e4", "role": "idle", "bandwidth_bytes_per_sec": 6.25e8, "cpu_speed": 4.0}
  ],
  "links": [{"from": "e1", "to": "e3", "bytes_per_sec": 1.0e8}]
}"#;

#[test]
fn example_parses_and_solves() {
    let snap = Snapshot::from_json(EXAMPLE).unwrap();
    assert_eq!(snap.containers[3].role, Role::Idle);
    let model = CostModel::new(&snap).unwrap();
    // e4 was never measured: reference 0.00011 s/record at speed 1, four times faster.
    assert!((model.compute_secs_per_record(3) - 0.00011 / 4.0).abs() < 1e-15);
    let now = model.evaluate(&model.current()).unwrap();
    let best = solve(&model).unwrap();
    assert!(best.epoch_secs <= now.epoch_secs * (1.0 + 1e-9));
    // Round trip.
    let text = serde_json::to_string(&snap).unwrap();
    assert_eq!(Snapshot::from_json(&text).unwrap(), snap);
}

#[test]
fn syntax_errors_name_line_and_column() {
    let err = Snapshot::from_json("{\n  \"job\": {,\n}").unwrap_err();
    assert!(
        matches!(err, OptimizerError::SnapshotJson { line: 2, .. }),
        "{err}"
    );
}

#[test]
fn unknown_fields_are_rejected() {
    let bad = EXAMPLE.replace("\"mini_batches\": 30}", "\"minibatches\": 30}");
    let err = Snapshot::from_json(&bad).unwrap_err();
    assert!(err.to_string().contains("minibatches"), "{err}");
}

#[test]
fn invalid_values_name_the_field() {
    let bad = EXAMPLE.replace(
        "\"bandwidth_bytes_per_sec\": 6.25e8",
        "\"bandwidth_bytes_per_sec\": 0.0",
    );
    let err = Snapshot::from_json(&bad).unwrap_err();
    assert!(
        err.to_string()
            .contains("containers[3].bandwidth_bytes_per_sec"),
        "{err}"
    );
    let bad = EXAMPLE.replace(
        "\"input_blocks\": 4, \"mini_batches\": 30},\n    {\"id\": \"e2\"",
        "\"input_blocks\": 3, \"mini_batches\": 30},\n    {\"id\": \"e2\"",
    );
    assert!(matches!(
        Snapshot::from_json(&bad).unwrap_err(),
        OptimizerError::InconsistentBlocks(_)
    ));
    let bad = EXAMPLE.replace("\"to\": \"e3\"", "\"to\": \"e9\"");
    assert!(matches!(
        Snapshot::from_json(&bad).unwrap_err(),
        OptimizerError::UnknownContainer { .. }
    ));
}
