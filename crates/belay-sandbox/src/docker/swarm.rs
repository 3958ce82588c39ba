//! [`SwarmJobs`] over the Engine API.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::models::LocalNodeState;
use bollard::query_parameters as qp;

use super::DockerRuntime;
use crate::swarm::{service_spec, JobSpec, SwarmJobs, TaskView};
use crate::SandboxError;

#[async_trait]
impl SwarmJobs for DockerRuntime {
    async fn swarm_active(&self) -> Result<bool, SandboxError> {
        self.check()?;
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| self.api_err("info", e))?;
        Ok(info
            .swarm
            .and_then(|s| s.local_node_state)
            .is_some_and(|s| s == LocalNodeState::ACTIVE))
    }

    async fn create_job(&self, spec: &JobSpec) -> Result<String, SandboxError> {
        self.check()?;
        let r = self
            .docker
            // The registry's credentials, so that every node can pull the image.
            .create_service(service_spec(spec), self.credentials(&spec.image))
            .await
            .map_err(|e| self.api_err("create service", e))?;
        r.id.ok_or_else(|| SandboxError::Docker {
            op: "create service",
            message: "the engine returned no service id".into(),
        })
    }

    async fn job_tasks(&self, service: &str) -> Result<Vec<TaskView>, SandboxError> {
        self.check()?;
        let filters = HashMap::from([("service".to_string(), vec![service.to_string()])]);
        let tasks = self
            .docker
            .list_tasks(Some(qp::ListTasksOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| self.api_err("list tasks", e))?;
        let name = |s: Option<String>| s.unwrap_or_default();
        Ok(tasks
            .into_iter()
            .map(|t| {
                let status = t.status.unwrap_or_default();
                let cs = status.container_status.unwrap_or_default();
                TaskView {
                    id: name(t.id),
                    state: status.state.map(|s| s.to_string()).unwrap_or_default(),
                    desired: t.desired_state.map(|s| s.to_string()).unwrap_or_default(),
                    exit_code: cs.exit_code,
                    error: status.err,
                    container: cs.container_id,
                }
            })
            .collect())
    }

    async fn remove_job(&self, service: &str) -> Result<(), SandboxError> {
        self.check()?;
        match self.docker.delete_service(service).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(self.api_err("remove service", e)),
        }
    }
}
