"""mnist_quickstart: A Flower / PyTorch app on MNIST."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from mnist_quickstart.task import Net, load_data
from mnist_quickstart.task import test as test_fn
from mnist_quickstart.task import train as train_fn

# Flower ClientApp
app = ClientApp()


def partition_data(context: Context):
    """This node's partition and the test set, as the run config sizes them."""
    return load_data(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        context.run_config["samples-per-client"],
        context.run_config["test-samples"],
        context.run_config["data-root"],
    )


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())

    # Load the data
    x_train, y_train, _, _ = partition_data(context)

    # The shuffle's seed depends only on the round and the partition, so a train call
    # is a function of (partition, round, received arrays) in any runtime.
    # FedAvg puts the round into the config it sends.
    server_round = msg.content["config"]["server-round"]
    seed = 1000 * server_round + context.node_config["partition-id"]

    # Call the training function
    train_loss = train_fn(
        model,
        x_train,
        y_train,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        context.run_config["batch-size"],
        seed,
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(x_train),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())

    # Load the data
    _, _, x_test, y_test = partition_data(context)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(model, x_test, y_test)

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(x_test),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)
