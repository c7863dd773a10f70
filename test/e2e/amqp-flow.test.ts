/**
 * The end-to-end scenario (flow-scenario.ts) on `mesh up --broker amqp://…`, in a scratch vhost of the machine's
 * RabbitMQ. What only RabbitMQ shows beyond the scenario's own broker checks is in amqp-accounts.test.ts.
 */
import { flowScenario } from "./flow-scenario.js";

flowScenario("amqp");
