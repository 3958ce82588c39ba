/// The Kubernetes API server failed or refused a request (E306, exit 3).
#[derive(Debug, thiserror::Error)]
#[error("Kubernetes: cannot {op} the batch's Job: {message}. Check the cluster with `kubectl get jobs` (belay uses the same kubeconfig), then rerun the same command: the batch resumes")]
pub struct KubeError {
    /// What belay was doing: `create`, `watch`, `list the pods of` …
    pub op: &'static str,
    pub message: String,
}

impl belay_record::Classify for KubeError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Infra
    }

    fn error_code(&self) -> &'static str {
        "BELAY-E306"
    }
}

/// A Job status's index list (`"1,3-5,7"`) that does not parse: the API
/// server sent what belay cannot read (E306, exit 3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an index list: {text:?} (at {part:?})")]
pub struct IndexListError {
    /// The whole list.
    pub text: String,
    /// The part of it that is no index or range.
    pub part: String,
}

impl belay_record::Classify for IndexListError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Infra
    }

    fn error_code(&self) -> &'static str {
        "BELAY-E306"
    }
}

/// At the executor's boundary, a Kubernetes failure is the batch's, with its
/// class and code kept.
impl From<KubeError> for belay_env::EnvError {
    fn from(e: KubeError) -> Self {
        belay_env::EnvError::Cluster(belay_env::ClusterError::new(e))
    }
}
