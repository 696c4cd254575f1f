//! Layered loading: defaults < TOML file < environment < flags.
//!
//! Each layer is checked on its own before the layers are merged by the
//! `config` crate, so that an unknown key or a badly typed value is reported
//! with the layer it came from (file, environment variable or flag).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use config::{Config, Environment, File, FileFormat};
use toml::Value;

use crate::{ConfError, CruiseConfig};

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "CRUISE_";
/// Separator between section and key in environment variable names.
pub const ENV_SEPARATOR: &str = "__";

/// The layers a configuration is built from, lowest precedence first.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    /// A TOML file, if any.
    pub file: Option<PathBuf>,
    /// The environment. Only variables named `CRUISE_<SECTION>__<KEY>` are read;
    /// other `CRUISE_*` variables (such as those an evaluator receives) are not
    /// configuration and are ignored.
    pub env: BTreeMap<String, String>,
    /// Flag overrides: `(dotted key, value, origin)` where origin names the flag.
    pub overrides: Vec<(String, String, String)>,
}

impl Layers {
    /// Layers with the given file and the process environment.
    pub fn from_process_env(file: Option<PathBuf>) -> Self {
        Layers {
            file,
            env: std::env::vars().collect(),
            overrides: Vec::new(),
        }
    }

    /// Adds an override from a flag such as `--epochs 3` (origin `--epochs`).
    pub fn set(&mut self, key: &str, value: impl ToString, origin: &str) {
        self.overrides
            .push((key.to_string(), value.to_string(), origin.to_string()));
    }

    /// Adds an override given as `KEY=VALUE` text (from `--set`).
    pub fn set_text(&mut self, text: &str) -> Result<(), ConfError> {
        let Some((k, v)) = text.split_once('=') else {
            return Err(ConfError::Override {
                text: text.to_string(),
            });
        };
        let key = k.trim();
        if key.is_empty() {
            return Err(ConfError::Override {
                text: text.to_string(),
            });
        }
        self.set(key, v.trim(), &format!("--set {text}"));
        Ok(())
    }

    /// Builds and validates the configuration.
    pub fn load(&self) -> Result<CruiseConfig, ConfError> {
        let schema = schema();
        let mut builder =
            Config::builder().add_source(File::from_str(&defaults_toml(), FileFormat::Toml));

        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfError::Read {
                path: path.clone(),
                source,
            })?;
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfError::Syntax {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
            check_table(&schema, &table, "", &format!("file {}", path.display()))?;
            builder = builder.add_source(File::from_str(&text, FileFormat::Toml));
        }

        let env = config_env(&self.env);
        for (var, value) in &env {
            let key = env_key(var);
            let origin = format!("environment variable {var}");
            let expected = lookup(&schema, &key).ok_or_else(|| unknown(&key, &origin))?;
            coerce(expected, value, &key, &origin)?;
        }
        if !env.is_empty() {
            builder = builder.add_source(
                Environment::with_prefix(ENV_PREFIX.trim_end_matches('_'))
                    .prefix_separator("_")
                    .separator(ENV_SEPARATOR)
                    .try_parsing(true)
                    .source(Some(env.into_iter().collect())),
            );
        }

        for (key, value, origin) in &self.overrides {
            let expected = lookup(&schema, key).ok_or_else(|| unknown(key, origin))?;
            let typed = coerce(expected, value, key, origin)?;
            builder = builder
                .set_override(key.as_str(), to_config_value(&typed))
                .map_err(|e| ConfError::Value {
                    message: format!("{origin}: {e}"),
                })?;
        }

        let merged = builder.build().map_err(|e| ConfError::Value {
            message: e.to_string(),
        })?;
        let cfg: CruiseConfig = merged.try_deserialize().map_err(|e| ConfError::Value {
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Every dotted key the configuration knows, sorted.
pub fn known_keys() -> Vec<String> {
    let mut out = Vec::new();
    flatten(&schema(), "", &mut out);
    out
}

fn schema() -> toml::Table {
    match Value::try_from(CruiseConfig::default()) {
        Ok(Value::Table(t)) => t,
        // The default configuration is plain data; serialising it cannot fail.
        _ => toml::Table::new(),
    }
}

fn defaults_toml() -> String {
    toml::to_string(&CruiseConfig::default()).unwrap_or_default()
}

fn flatten(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let key = join(prefix, k);
        match v {
            Value::Table(t) => flatten(t, &key, out),
            _ => out.push(key),
        }
    }
}

fn join(prefix: &str, k: &str) -> String {
    if prefix.is_empty() {
        k.to_string()
    } else {
        format!("{prefix}.{k}")
    }
}

fn lookup<'a>(schema: &'a toml::Table, key: &str) -> Option<&'a Value> {
    let mut parts = key.split('.');
    let first = parts.next()?;
    let mut cur = schema.get(first)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    if cur.is_table() { None } else { Some(cur) }
}

fn check_table(
    schema: &toml::Table,
    table: &toml::Table,
    prefix: &str,
    origin: &str,
) -> Result<(), ConfError> {
    for (k, v) in table {
        let key = join(prefix, k);
        match (schema.get(k), v) {
            (Some(Value::Table(s)), Value::Table(t)) => check_table(s, t, &key, origin)?,
            (Some(Value::Table(_)), _) => {
                return Err(ConfError::Value {
                    message: format!("`{key}` in {origin} must be a section ([{key}])"),
                });
            }
            (Some(expected), found) => check_type(expected, found, &key, origin)?,
            (None, _) => return Err(unknown(&key, origin)),
        }
    }
    Ok(())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "true or false",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "a list",
        Value::Table(_) => "a section",
    }
}

fn check_type(expected: &Value, found: &Value, key: &str, origin: &str) -> Result<(), ConfError> {
    let ok = matches!(
        (expected, found),
        (Value::String(_), Value::String(_))
            | (Value::Integer(_), Value::Integer(_))
            | (Value::Float(_), Value::Float(_) | Value::Integer(_))
            | (Value::Boolean(_), Value::Boolean(_))
            | (Value::Array(_), Value::Array(_))
    );
    if ok {
        Ok(())
    } else {
        Err(ConfError::Value {
            message: format!(
                "`{key}` in {origin} must be {}, found {}",
                type_name(expected),
                type_name(found)
            ),
        })
    }
}

/// Parses a textual value (from the environment or a flag) as the type the
/// schema expects.
fn coerce(expected: &Value, text: &str, key: &str, origin: &str) -> Result<Value, ConfError> {
    let fail = || ConfError::Value {
        message: format!(
            "`{key}` from {origin} must be {}, got {text:?}",
            type_name(expected)
        ),
    };
    match expected {
        Value::String(_) => Ok(Value::String(text.to_string())),
        Value::Integer(_) => text.trim().parse().map(Value::Integer).map_err(|_| fail()),
        Value::Float(_) => text.trim().parse().map(Value::Float).map_err(|_| fail()),
        Value::Boolean(_) => text.trim().parse().map(Value::Boolean).map_err(|_| fail()),
        Value::Array(_) => {
            let doc: toml::Table = format!("v = {text}").parse().map_err(|_| fail())?;
            match doc.get("v") {
                Some(v @ Value::Array(_)) => Ok(v.clone()),
                _ => Err(fail()),
            }
        }
        _ => Err(fail()),
    }
}

fn to_config_value(v: &Value) -> config::Value {
    match v {
        Value::String(s) => s.clone().into(),
        Value::Integer(i) => (*i).into(),
        Value::Float(f) => (*f).into(),
        Value::Boolean(b) => (*b).into(),
        Value::Array(a) => a.iter().map(to_config_value).collect::<Vec<_>>().into(),
        Value::Datetime(d) => d.to_string().into(),
        Value::Table(t) => t
            .iter()
            .map(|(k, v)| (k.clone(), to_config_value(v)))
            .collect::<std::collections::HashMap<_, _>>()
            .into(),
    }
}

/// The configuration variables among `env`.
fn config_env(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains(ENV_SEPARATOR))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn env_key(var: &str) -> String {
    var[ENV_PREFIX.len()..]
        .to_ascii_lowercase()
        .replace(ENV_SEPARATOR, ".")
}

fn unknown(key: &str, origin: &str) -> ConfError {
    ConfError::UnknownKey {
        key: key.to_string(),
        origin: origin.to_string(),
        suggestion: suggest(key),
    }
}

fn suggest(key: &str) -> Option<String> {
    let sections = schema().keys().cloned().collect::<Vec<_>>();
    known_keys()
        .into_iter()
        .chain(sections)
        .map(|k| (edit_distance(&k, key), k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 5))
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Loads a file alone (no environment, no flags). Used by tests and tools.
pub fn load_file(path: &Path) -> Result<CruiseConfig, ConfError> {
    Layers {
        file: Some(path.to_path_buf()),
        ..Layers::default()
    }
    .load()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SyncMode;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn defaults_are_valid() {
        let cfg = Layers::default().load().unwrap();
        assert_eq!(cfg, CruiseConfig::default());
        assert_eq!(cfg.job.initial_split(), (3, 1));
    }

    #[test]
    fn layers_apply_in_order() {
        let f = write("[job]\nepochs = 7\nmini_batch = 50\ncontainers = 3\n");
        let mut layers = Layers {
            file: Some(f.path().to_path_buf()),
            ..Default::default()
        };
        layers
            .env
            .insert("CRUISE_JOB__MINI_BATCH".into(), "60".into());
        layers.env.insert("CRUISE_JOB__EPOCHS".into(), "8".into());
        // Not configuration: no double underscore.
        layers.env.insert("CRUISE_AM_ADDR".into(), "x".into());
        layers.set("job.epochs", 9, "--epochs");
        let cfg = layers.load().unwrap();
        assert_eq!(cfg.job.epochs, 9, "flag beats environment");
        assert_eq!(cfg.job.mini_batch, 60, "environment beats file");
        assert_eq!(cfg.job.containers, 3, "file beats default");
        assert_eq!(cfg.job.seed, 42, "default kept");
    }

    #[test]
    fn unknown_key_in_file_names_key_and_file() {
        let f = write("[job]\nepoch = 7\n");
        let err = load_file(f.path()).unwrap_err().to_string();
        assert!(err.contains("`job.epoch`"), "{err}");
        assert!(err.contains(&f.path().display().to_string()), "{err}");
        assert!(err.contains("did you mean `job.epochs`"), "{err}");
    }

    #[test]
    fn pipeline_depth_out_of_range_named() {
        for bad in ["0", "17"] {
            let f = write(&format!("[job]\npipeline_depth = {bad}\n"));
            let err = load_file(f.path()).unwrap_err().to_string();
            assert!(
                err.contains("job.pipeline_depth") && err.contains("from 1 to 16"),
                "{err}"
            );
        }
        let f = write("[job]\npipeline_depth = 4\n");
        assert_eq!(
            load_file(f.path()).map(|c| c.job.pipeline_depth).ok(),
            Some(4)
        );
    }

    #[test]
    fn unknown_section_rejected() {
        let f = write("[jobs]\nepochs = 7\n");
        let err = load_file(f.path()).unwrap_err().to_string();
        assert!(err.contains("`jobs`"), "{err}");
        assert!(err.contains("did you mean `job`"), "{err}");
    }

    #[test]
    fn unknown_env_var_named() {
        let mut layers = Layers::default();
        layers.env.insert("CRUISE_JOB__EPOCSH".into(), "3".into());
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("CRUISE_JOB__EPOCSH"), "{err}");
        assert!(err.contains("job.epochs"), "{err}");
    }

    #[test]
    fn bad_types_named() {
        let f = write("[job]\nepochs = \"many\"\n");
        let err = load_file(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("`job.epochs`") && err.contains("an integer"),
            "{err}"
        );

        let mut layers = Layers::default();
        layers.set("job.epochs", "x", "--epochs");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("--epochs") && err.contains("\"x\""), "{err}");
    }

    #[test]
    fn syntax_error_names_file() {
        let f = write("[job\n");
        let err = load_file(f.path()).unwrap_err().to_string();
        assert!(err.contains("not valid TOML"), "{err}");
        assert!(err.contains(&f.path().display().to_string()), "{err}");
    }

    #[test]
    fn enums_and_lists_from_flags() {
        let mut layers = Layers::default();
        layers.set("job.sync", "ssp", "--sync");
        layers.set("job.staleness", 2, "--staleness");
        layers
            .set_text(r#"runtime.evaluator_command=["/bin/true", "x"]"#)
            .unwrap();
        let cfg = layers.load().unwrap();
        assert_eq!(cfg.job.sync, SyncMode::Ssp);
        assert_eq!(cfg.job.staleness, 2);
        assert_eq!(cfg.runtime.evaluator_command, vec!["/bin/true", "x"]);

        let mut layers = Layers::default();
        layers.set("job.sync", "sometimes", "--sync");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("sometimes"), "{err}");
    }

    #[test]
    fn validation_names_key() {
        let mut layers = Layers::default();
        layers.set("runtime.max_containers", 8, "--set");
        layers.set("job.containers", 20, "--containers");
        let err = layers.load().unwrap_err().to_string();
        assert!(
            err.contains("job.containers") && err.contains("max_containers"),
            "{err}"
        );

        let mut layers = Layers::default();
        layers.set("job.staleness", 1, "--staleness");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("job.staleness"), "{err}");
    }

    #[test]
    fn app_sections_validated() {
        let mut layers = Layers::default();
        layers.set("job.app", "lda", "--app");
        layers.set("lda.topics", 1, "--set lda.topics=1");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("lda.topics"), "{err}");

        let mut layers = Layers::default();
        layers.set("nmf.generate_density", 1.5, "--set");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("nmf.generate_density"), "{err}");

        let mut layers = Layers::default();
        layers.set("lasso.generate_support", 1000, "--set");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("lasso.generate_support"), "{err}");
    }

    #[test]
    fn eval_input_only_for_stateless_apps() {
        let mut layers = Layers::default();
        layers.set("job.app", "nmf", "--app");
        layers.set("job.eval_input", "/tmp/x", "--eval-input");
        let err = layers.load().unwrap_err().to_string();
        assert!(
            err.contains("job.eval_input") && err.contains("nmf"),
            "{err}"
        );

        let mut layers = Layers::default();
        layers.set("job.app", "lasso", "--app");
        layers.set("job.eval_input", "/tmp/x", "--eval-input");
        let cfg = layers.load().unwrap();
        assert_eq!(cfg.job.app, crate::AppKind::Lasso);
        assert_eq!(cfg.job.eval_input, "/tmp/x");
    }

    #[test]
    fn capacity_schedule_parsed_and_checked() {
        let mut layers = Layers::default();
        layers.set("runtime.capacity_schedule", "2:6, 10.5:4", "--set");
        let cfg = layers.load().unwrap();
        let s = cfg.runtime.capacity_schedule().unwrap();
        assert_eq!(
            s,
            vec![
                (std::time::Duration::from_secs(2), 6),
                (std::time::Duration::from_millis(10_500), 4)
            ]
        );
        assert_eq!(cfg.runtime.capacity_ceiling(&cfg.job), 6);
        for bad in ["5", "a:3", "3:x", "3:1", "5:4,2:3"] {
            let mut layers = Layers::default();
            layers.set("runtime.capacity_schedule", bad, "--set");
            let err = layers.load().unwrap_err().to_string();
            assert!(err.contains("runtime.capacity_schedule"), "{bad}: {err}");
        }
    }

    #[test]
    fn malformed_set_rejected() {
        let mut layers = Layers::default();
        assert!(layers.set_text("job.epochs").is_err());
        assert!(layers.set_text("=3").is_err());
    }

    #[test]
    fn emulation_parsed_and_checked() {
        let mut layers = Layers::default();
        layers.set(
            "emulation.containers",
            "2*0.3/400mbit, 0.15/1.5gbit, -/800kbit, 0.5",
            "--set",
        );
        let cfg = layers.load().unwrap();
        let c = cfg.emulation.parsed().unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(
            c[0],
            crate::EmulatedContainer {
                cpu: Some(0.3),
                bits_per_sec: Some(4e8)
            }
        );
        assert_eq!(c[1], c[0]);
        assert_eq!(c[2].bits_per_sec, Some(1.5e9));
        assert_eq!((c[3].cpu, c[3].bits_per_sec), (None, Some(8e5)));
        assert_eq!((c[4].cpu, c[4].bits_per_sec), (Some(0.5), None));
        assert_eq!(cfg.emulation.subnet_prefix().unwrap(), [10, 78, 0]);
        assert!(!Layers::default().load().unwrap().emulation.enabled());

        for bad in [
            "0*0.3",
            "x*0.3",
            "0/100mbit",
            "abc",
            "0.3/100",
            "0.3/100mbps",
            "0.3/10kbit",
        ] {
            let mut layers = Layers::default();
            layers.set("emulation.containers", bad, "--set");
            let err = layers.load().unwrap_err().to_string();
            assert!(err.contains("emulation.containers"), "{bad}: {err}");
        }
        for bad in ["10.78.0.0", "10.78.0.0/16", "10.78.0.5/24", "8.8.8.0/24"] {
            let mut layers = Layers::default();
            layers.set("emulation.subnet", bad, "--set");
            let err = layers.load().unwrap_err().to_string();
            assert!(err.contains("emulation.subnet"), "{bad}: {err}");
        }
        let mut layers = Layers::default();
        layers.set("emulation.cpu_period_us", 10, "--set");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("emulation.cpu_period_us"), "{err}");
    }

    /// Only the local runtime emulates; a real cluster says so by key.
    #[test]
    fn emulation_only_on_the_local_runtime() {
        for kind in ["yarn", "mesos"] {
            let mut layers = Layers::default();
            layers.set("runtime.kind", kind, "--runtime");
            layers.set("mesos.master", "m:5050", "--master");
            layers.set("emulation.containers", "4*0.25/100mbit", "--set");
            let err = layers.load().unwrap_err().to_string();
            assert!(
                err.contains("emulation.containers") && err.contains(kind),
                "{kind}: {err}"
            );
        }
    }

    /// The sandbox examples load and select their runtime.
    #[test]
    fn cluster_examples_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let y = load_file(&dir.join("yarn.toml")).unwrap();
        assert_eq!(y.runtime.kind, crate::RuntimeKind::Yarn);
        let m = load_file(&dir.join("mesos.toml")).unwrap();
        assert_eq!(m.runtime.kind, crate::RuntimeKind::Mesos);
        assert_eq!(m.mesos.masters(), vec!["127.0.0.1:5050"]);
    }

    #[test]
    fn mesos_needs_a_master() {
        let mut layers = Layers::default();
        layers.set("runtime.kind", "mesos", "--runtime");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("mesos.master"), "{err}");
        layers.set("mesos.master", "m1:5050, m2:5050", "--master");
        let cfg = layers.load().unwrap();
        assert_eq!(cfg.mesos.masters(), vec!["m1:5050", "m2:5050"]);
    }

    #[test]
    fn yarn_prefix_checked() {
        let mut layers = Layers::default();
        layers.set("yarn.service_name_prefix", "Cruise", "--set");
        let err = layers.load().unwrap_err().to_string();
        assert!(err.contains("yarn.service_name_prefix"), "{err}");
    }

    /// `conf/examples/local.toml` must load and mention every key, so the
    /// documentation cannot fall behind the code.
    #[test]
    fn example_documents_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/local.toml");
        let cfg = load_file(&path).unwrap();
        assert_eq!(cfg.job.app, crate::AppKind::Mlr);
        let text = std::fs::read_to_string(&path).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let mut present = Vec::new();
        flatten(&table, "", &mut present);
        for key in known_keys() {
            assert!(present.contains(&key), "examples/local.toml lacks `{key}`");
        }
    }
}
