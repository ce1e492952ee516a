"""Several GradManagers at once, with MegEngine's rules: a manager back-propagates only what it
recorded and sees the backward of the managers entered after it; grouped managers are peers."""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F

X = np.array([0.3, -1.2, 2.0])


def test_visibility_by_order():
    """MegEngine's test: gm2 was entered before gm, so gm does not see gm2's backward."""
    x = mg.tensor(X)
    gm = ad.GradManager().attach(x)
    gm2 = ad.GradManager().attach(x)
    with gm2:
        with gm:
            y = F.cos(x)
            gm2.backward(y)
            np.testing.assert_allclose(x.grad.numpy(), -np.sin(X), rtol=1e-12)
            gm.backward(x.grad)
    np.testing.assert_allclose(x.grad.numpy(), -np.sin(X), rtol=1e-12)


def test_second_order_with_the_outer_manager():
    x = mg.tensor(X)
    gm = ad.GradManager().attach(x)
    gm2 = ad.GradManager().attach(x)
    with gm:
        with gm2:
            gm2.backward(F.cos(x))
        gm.backward(x.grad)
    np.testing.assert_allclose(x.grad.numpy(), -np.sin(X) - np.cos(X), rtol=1e-12)


def test_both_managers_back_propagate_the_same_graph():
    x = mg.tensor(X)
    outer, inner = ad.GradManager().attach(x), ad.GradManager().attach(x)
    with outer:
        with inner:
            y = F.exp(x).sum()
            inner.backward(y)
        outer.backward(y)  # the graph was kept for the outer manager
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(X), rtol=1e-12)


def test_a_manager_does_not_go_through_ops_recorded_before_it_started():
    x = mg.tensor(X)
    outer, inner = ad.GradManager().attach(x), ad.GradManager().attach(x)
    with outer:
        a = x * 2.0  # recorded for outer only
        with inner:
            b = (a * x).sum()  # inner sees a as a constant
            inner.backward(b)
            np.testing.assert_allclose(x.grad.numpy(), 2 * X, rtol=1e-12)
        x.grad = None
        outer.backward(b)
    np.testing.assert_allclose(x.grad.numpy(), 4 * X, rtol=1e-12)


def test_group_records_both_and_each_backward_counts():
    x = mg.tensor(X)
    gm, gm2 = ad.GradManager().attach(x), ad.GradManager().attach(x)
    group = gm | gm2
    assert isinstance(group, ad.GradManagerGroup) and group.managers == [gm, gm2]
    with group:
        assert gm.is_recording and gm2.is_recording
        y = F.cos(x)
        gm.backward(y)
        gm2.backward(y)
    assert not gm.is_recording and not gm2.is_recording
    np.testing.assert_allclose(x.grad.numpy(), -2 * np.sin(X), rtol=1e-12)
    x.grad = None
    with gm | gm2 as both:
        both.backward(F.cos(x).sum())
    np.testing.assert_allclose(x.grad.numpy(), -2 * np.sin(X), rtol=1e-12)


def test_grouped_managers_do_not_see_each_other():
    x = mg.tensor(X)
    gm, gm2 = ad.GradManager().attach(x), ad.GradManager().attach(x)
    with gm | gm2:
        y = F.cos(x)
        gm2.backward(y)
        gm.backward(x.grad)
    np.testing.assert_allclose(x.grad.numpy(), -np.sin(X), rtol=1e-12)


def test_groups_merge():
    gms = [ad.GradManager() for _ in range(4)]
    assert (gms[0] | gms[1] | gms[2]).managers == gms[:3]
    assert ((gms[0] | gms[1]) | (gms[2] | gms[3])).managers == gms
    assert "GradManagerGroup" in repr(gms[0] | gms[1])
